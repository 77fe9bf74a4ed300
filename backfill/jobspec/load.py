"""Part: foundation. Load a job file: YAML -> JobSpec, with one-line errors naming the file, the field path and the
fix."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from backfill.errors import SpecError
from backfill.jobspec.models import SECRET_REF, JobSpec, SecuritySpec
from backfill.jobspec.topology import topology_problem


@dataclass(frozen=True)
class Job:
    """A validated job and the folder its relative paths are resolved against."""

    spec: JobSpec
    path: Path

    @property
    def base(self) -> Path:
        """Folder of the job file (paths in a job are relative to it)."""
        return self.path.parent

    def resolve(self, relative: str) -> str:
        """Absolute path of a path written in the job file."""
        return str((self.base / relative).resolve())

    def input_bytes(self) -> int | None:
        """Bytes of the files under the job's sources (a Delta table's old versions included), or None when a
        source is a Kafka topic or not a local path: an estimate of the run's size, made without Spark."""
        sources = list(self.spec.sources.values())
        if any(s.format == "kafka" or s.path is None for s in sources):
            return None
        return local_bytes(s.path if "://" in s.path else self.resolve(s.path) for s in sources if s.path)


def local_bytes(paths: Iterable[str]) -> int | None:
    """Bytes of the files at or under local paths (`path@version` counts the whole table); None when one is a
    URI (kafka://, s3://) or missing."""
    total = 0
    for text in paths:
        if "://" in text:
            return None
        root = Path(text.rsplit("@", 1)[0] if "@" in Path(text).name else text)
        if not root.exists():
            return None
        files = [root] if root.is_file() else (f for f in root.rglob("*") if f.is_file())
        total += sum(f.stat().st_size for f in files)
    return total


def load_job(path: str | Path) -> Job:
    """Read and validate a job file; raise SpecError with one clear line."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{file}: no such job file; pass the path of a job YAML (e.g. jobs/demo.yaml)")
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{file}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{file}: a job is a YAML mapping with name, sources, operators, sinks")
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        raise SpecError(f"{file}: {describe(errors[0])}") from None
    problem = topology_problem(spec.operators)  # who reads whom (docs/semantics.md §18)
    if problem is not None:
        raise SpecError(f"{file}: {problem}")
    return Job(spec=_catalog_tables(_absolute_security(spec, file.resolve().parent)), path=file.resolve())


def _catalog_tables(spec: JobSpec) -> JobSpec:
    """`table:` sources and sinks with their catalog location as `path` (absolute), so every part of a run reads
    and writes the table's files; the name stays in `table` (for the manifest). A sink table that does not
    exist yet gets the catalog's default location and is registered after its first publish (execute.py)."""
    if not any(x.table for x in [*spec.sources.values(), *spec.sinks.values()]):
        return spec
    from backfill.session import catalog_table

    def located(item: Any, where: str) -> Any:
        if not item.table:
            return item
        try:
            location, exists = catalog_table(item.table)
        except SpecError as exc:
            raise SpecError(f"{where}.{exc}") from None
        if where.startswith("sources") and not exists:
            raise SpecError(f"{where}.table {item.table}: the catalog has no such table (create it with CREATE TABLE "
                            "... USING delta, or name another)")
        return item.model_copy(update={"path": location})

    return spec.model_copy(update={
        "sources": {n: located(s, f"sources.{n}") for n, s in spec.sources.items()},
        "sinks": {n: located(s, f"sinks.{n}") for n, s in spec.sinks.items()}})


def load_security(path: Path) -> SecuritySpec:
    """A YAML file of `kafka.security` settings (`backfill archive --security`), its files relative to it."""
    if not path.is_file():
        raise SpecError(f"--security {path}: no such file (a YAML mapping of protocol, mechanism, username, ...)")
    try:
        sec = SecuritySpec.model_validate(yaml.safe_load(path.read_text()))
    except yaml.YAMLError:
        raise SpecError(f"--security {path}: not valid YAML") from None
    except ValidationError as exc:
        raise SpecError(f"--security {path}: {describe(exc.errors()[0])}") from None
    return _absolute(sec, path.resolve().parent)


def _absolute_security(spec: JobSpec, base: Path) -> JobSpec:
    """The files of `kafka.security` (ca_file, ${file:PATH}) relative to the job file, as absolute paths: every
    Kafka client of the run then reads the same files wherever it starts."""
    sources = {}
    for name, source in spec.sources.items():
        if source.kafka is not None and source.kafka.security is not None:
            kafka = source.kafka.model_copy(update={"security": _absolute(source.kafka.security, base)})
            source = source.model_copy(update={"kafka": kafka})
        sources[name] = source
    return spec.model_copy(update={"sources": sources})


def _absolute(sec: SecuritySpec, base: Path) -> SecuritySpec:
    def file_ref(text: str | None) -> str | None:
        match = SECRET_REF.match(text or "")
        return "${file:" + str((base / match[2]).resolve()) + "}" if match and match[1] == "file" else text

    ca = str((base / sec.ca_file).resolve()) if sec.ca_file else None
    return sec.model_copy(update={"ca_file": ca, "password": file_ref(sec.password),
                                  "username": file_ref(sec.username)})


def field_path(loc: tuple[Any, ...]) -> str:
    """('operators', 0, 'aggregate', 'window') -> 'operators[0].aggregate.window'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "FoldAggregation", "function-before[parse_duration(), int]"):
            continue  # union member tags are not part of the user's path
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def describe(error: dict[str, Any]) -> str:
    """One line for one pydantic error: `path: "value" problem; what is allowed`."""
    path = field_path(tuple(error["loc"]))
    kind, msg, value = error["type"], error["msg"], error.get("input")
    shown = _show(value)
    if kind == "value_error" and msg.startswith("Value error, @"):
        # validators name the precise sub-field as "@sub.path: text"
        sub, text = msg.removeprefix("Value error, @").split(": ", 1)
        joined = sub if path == "(top level)" else f"{path}.{sub}" if not sub.startswith("[") else path + sub
        return f"{joined}: {text}"
    if kind == "missing":
        return f"{path}: is required"
    if kind == "extra_forbidden":
        return f"{path}: unknown field; check the spelling against docs/job-spec.md"
    if kind == "literal_error":
        allowed = msg.split("Input should be ", 1)[-1].replace("'", "")
        return f"{path}: {shown} is not allowed; use {allowed}"
    if kind == "value_error":
        return f"{path}: {msg.removeprefix('Value error, ')}"
    return f"{path}: {shown} is invalid ({msg})"


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if _scalar(value):
        return repr(value)
    return type(value).__name__
