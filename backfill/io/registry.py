"""Part: io. Writer schemas by id: a schema registry's Confluent REST API, or a folder of schema files.

`GET {url}/schemas/ids/{id}` answers `{"schema": TEXT, "schemaType": "AVRO" | "PROTOBUF" | "JSON"}` (no
schemaType: Avro). Offline, `<id>.avsc` holds an Avro schema, `<id>.json` a JSON Schema and `<id>.desc` a
protobuf descriptor set (`protoc --include_imports --descriptor_set_out`). A protobuf schema from a registry is
read as the serialized FileDescriptorProto (base64) that confluent-kafka's serializer registers; a `.proto`
text cannot be compiled here and is refused with one line (give the descriptor set offline instead).
The driver asks once per distinct id of a run (io/formats.py); a registry that does not answer is an error.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from backfill.errors import SourceError, SpecError
from backfill.jobspec.models import RegistrySpec

TIMEOUT_S = 10.0
SUFFIX = {"avro": ".avsc", "protobuf": ".desc", "json_schema": ".json"}
TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


@dataclass(frozen=True)
class WriterSchema:
    """One schema id's schema: Avro or JSON Schema text, or a protobuf FileDescriptorSet (serialized)."""

    id: int
    text: str | None = None
    descriptors: bytes | None = None


def fetch_schemas(registry: RegistrySpec, base: str, fmt: str, ids: list[int], where: str
                  ) -> dict[int, WriterSchema | None]:
    """Each id's writer schema (None: the registry or the folder has no such id)."""
    if registry.schemas is not None:
        folder = registry.schemas if os.path.isabs(registry.schemas) else os.path.join(base, registry.schemas)
        if not os.path.isdir(folder):
            raise SpecError(f"{where}.registry.schemas: {folder} is not a folder (of <id>{SUFFIX[fmt]} files); it "
                            "is relative to the job file")
        return {i: _from_file(folder, fmt, i) for i in ids}
    assert registry.url is not None
    return {i: _from_url(registry.url, fmt, i, where) for i in ids}


def _from_file(folder: str, fmt: str, schema_id: int) -> WriterSchema | None:
    path = os.path.join(folder, f"{schema_id}{SUFFIX[fmt]}")
    if not os.path.isfile(path):
        return None
    if fmt == "protobuf":
        with open(path, "rb") as fh:
            return WriterSchema(schema_id, descriptors=fh.read())
    with open(path) as fh:
        return WriterSchema(schema_id, text=fh.read())


def _from_url(url: str, fmt: str, schema_id: int, where: str) -> WriterSchema | None:
    address = f"{url.rstrip('/')}/schemas/ids/{schema_id}"
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise SourceError(f"{where}.registry.url: the schema registry answered HTTP {exc.code} for schema id "
                          f"{schema_id} at {shown_url(url)}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"{where}.registry.url: no schema registry answered at {shown_url(url)} within "
                          f"{TIMEOUT_S:.0f} s ({reason}); check the address and that it runs") from None
    kind = doc.get("schemaType") or "AVRO"
    if kind != TYPES[fmt]:
        raise SourceError(f"{where}.format: schema id {schema_id} is a {kind} schema in the registry, not {fmt}")
    text = doc.get("schema")
    if not isinstance(text, str):
        raise SourceError(f"{where}.registry.url: the registry's answer for schema id {schema_id} has no schema")
    if fmt != "protobuf":
        return WriterSchema(schema_id, text=text)
    return WriterSchema(schema_id, descriptors=_descriptor_set(text, schema_id, where))


def _descriptor_set(text: str, schema_id: int, where: str) -> bytes:
    """A registry's protobuf schema (a base64 FileDescriptorProto) as a one-file FileDescriptorSet."""
    from google.protobuf import descriptor_pb2

    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, Exception):  # noqa: BLE001 - protobuf's DecodeError is not exported
        raise SourceError(f"{where}.registry: schema id {schema_id} is protobuf text (.proto), which backfill "
                          "cannot compile; give its descriptor set offline (registry: {schemas: DIR} with "
                          f"{schema_id}.desc from protoc --include_imports --descriptor_set_out)") from None
    return descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString()


def serializer_client(url: str) -> tuple[Any, dict[str, str]]:
    """confluent-kafka's registry client for producing test and demo data, and the serializer settings to use.

    The client gets a request timeout (its default is none: a registry that stalls once would hang the producer
    for good; with one, the client retries). The serializers name the subject `<topic>-value` (`-key`) outright:
    left to its default, confluent-kafka asks the registry for topic associations first on every new topic, an
    endpoint registries other than Confluent's do not have.
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": TIMEOUT_S}), {"subject.name.strategy.type": "TOPIC"}


def shown_url(url: str) -> str:
    """The URL without any user:password part (nothing secret is printed)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rsplit('@', 1)[-1]}"
