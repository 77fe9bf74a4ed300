"""The house's shape, checked on the source: parts, the direction of imports, no circles (docs/architecture.md).

Every import counts, also those inside functions and under TYPE_CHECKING: a lazy import is still a
dependency a reader has to follow.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "backfill"

# the parts, lowest first; a module may import its own part and any lower one
LAYERS: list[tuple[str, ...]] = [
    ("errors", "sqldialect", "jobspec", "ranges", "columns", "ledger", "resources", "session"),
    ("io", "time", "order"),
    ("ops",),
    ("checks",),
    ("plan",),
    ("verify", "conformance", "scheduling"),
    ("summary", "execute", "api", "doctor", "server", "demo", "cli", "__main__", "__init__"),
]
# the reference engine checks the Spark engine, so it shares nothing of it (its own windows, order, bounds)
REFERENCE_MAY_IMPORT = {"errors", "sqldialect", "jobspec", "reference"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "backfill":
                # `from backfill.x import y`: the submodule x.y where y is one, and x itself: Python runs the
                # package's __init__ first (a package that imports its modules closes a circle through it)
                submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = [*submodules, node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "backfill"]
            graph[name].update(t for t in targets if t in modules and t not in (name, "backfill"))
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _rank(part: str) -> int:
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"backfill.{part} belongs to no part: add it to LAYERS and to docs/architecture.md")


def test_every_part_is_placed() -> None:
    for module in _graph():
        if _part(module) != "reference":
            _rank(_part(module))


def test_no_import_points_up() -> None:
    upward = []
    for module, targets in _graph().items():
        if _part(module) == "reference":
            continue
        for target in targets:
            if _part(target) == "reference":
                if _rank(_part(module)) <= _rank("plan"):
                    upward.append(f"{module} -> {target} (only checks of the engine may run the reference)")
            elif _rank(_part(target)) > _rank(_part(module)):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_reference_engine_shares_nothing_with_the_spark_engine() -> None:
    borrowed = [f"{m} -> {t}" for m, targets in _graph().items() if _part(m) == "reference"
                for t in targets if _part(t) not in REFERENCE_MAY_IMPORT]
    assert borrowed == []


def test_no_circles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert found == []


@pytest.mark.parametrize("module", sorted(p for p in _graph() if _part(p) not in ("__init__",)))
def test_each_module_says_its_part(module: str) -> None:
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT.parent / module.replace(".", "/") / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert doc.startswith("Part: "), f"{module}: its docstring should start with 'Part: <part>.' (docs/architecture.md)"
