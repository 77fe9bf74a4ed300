"""Part: foundation. Typed job spec: the YAML contract of docs/job-spec.md as pydantic models."""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator,
                      model_validator)

from backfill.jobspec import versions
from backfill.jobspec.durations import INSTANT_HINT, parse_duration, parse_instant

Duration = Annotated[int, BeforeValidator(parse_duration)]
LEGACY_GRACE = "legacy"
DAY_MS = 86_400_000


class Strict(BaseModel):
    """Base: unknown fields are errors (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# keys and values in the schema registry's wire format: magic byte 0, a 4-byte big-endian schema id, the payload
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
BINARY_FORMATS = (*REGISTRY_FORMATS, "bytes")  # a JSONL source carries these as base64 (`key_b64`, `value_b64`)


class RegistrySpec(Strict):
    """Where the writer schemas come from, by id: a registry's Confluent REST API or a folder of schema files."""

    url: str | None = None  # GET {url}/schemas/ids/{id}
    schemas: str | None = None  # offline: <id>.avsc, <id>.desc (a protobuf descriptor set), <id>.json

    @model_validator(mode="after")
    def _one(self) -> RegistrySpec:
        if (self.url is None) == (self.schemas is None):
            raise ValueError("@url: give exactly one of url (the registry, e.g. http://registry:8081) or schemas "
                             "(a folder of <id>.avsc / <id>.desc / <id>.json files)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"@url: {self.url!r} is not an http(s) URL, e.g. http://registry:8081")
        return self


class Encoded(Strict):
    """The formats a key and a value share: the registry formats' settings (job-spec "Real data formats")."""

    registry: RegistrySpec | None = None
    schema_: str | None = Field(default=None, alias="schema")
    reader_schema: str | None = None  # Avro: every writer version read as this schema (resolution, defaults)
    message: str | None = None  # protobuf: the message type (full name), e.g. demo.Click

    def _check_encoding(self, fmt: str, schema_formats: tuple[str, ...]) -> None:
        if fmt in REGISTRY_FORMATS:
            plain = fmt == "avro" and self.schema_ is not None
            if self.registry is None and not plain:
                hint = " (or schema: FILE for plain Avro without the header)" if fmt == "avro" else ""
                raise ValueError(f"@registry: format: {fmt} reads the registry's wire format; give registry: "
                                 f"{{url: http://...}} or registry: {{schemas: DIR}}{hint}")
            if plain and self.registry is not None:
                raise ValueError("@schema: plain Avro (schema: FILE) has no header, so no registry; give one of them")
            if self.schema_ is not None and fmt != "avro":
                raise ValueError(f"@schema: format: {fmt} takes its schemas from the registry; schema: is for json "
                                 "and plain avro")
        else:
            for name in ("registry", "reader_schema", "message"):
                if getattr(self, name) is not None:
                    raise ValueError(f"@{name}: is only allowed with format: avro, protobuf or json_schema")
            if self.schema_ is not None and fmt not in schema_formats:
                raise ValueError(f"@schema: is only allowed with format: {' or '.join(schema_formats)}")
        if self.message is not None and fmt != "protobuf":
            raise ValueError("@message: names a protobuf message type; it is only allowed with format: protobuf")
        if self.reader_schema is not None and fmt != "avro":
            raise ValueError("@reader_schema: is an Avro schema; it is only allowed with format: avro")


class KeySpec(Encoded):
    format: Literal["string", "json", "long", "bytes", "avro", "protobuf", "json_schema"] = "string"

    @model_validator(mode="after")
    def _encoding(self) -> KeySpec:
        self._check_encoding(self.format, ())
        return self


class ValueSpec(Encoded):
    format: Literal["json", "string", "avro", "protobuf", "json_schema"] = "string"

    @model_validator(mode="after")
    def _schema_needs_json(self) -> ValueSpec:
        self._check_encoding(self.format, ("json",))
        return self


class TimestampSpec(Strict):
    extractor: Literal["record", "field"] = "record"
    field: str | None = None
    on_invalid: Literal["fail", "skip", "partition_time"] = "fail"

    @model_validator(mode="after")
    def _field_with_field_extractor(self) -> TimestampSpec:
        if self.extractor == "field" and not self.field:
            raise ValueError("@field: is required with extractor: field (the value field holding epoch ms, e.g. field: ts)")
        if self.extractor == "record" and self.field:
            raise ValueError("@field: is only used with extractor: field")
        return self


SECRET_REF = re.compile(r"^\$\{(env|file):([^}]+)\}$")  # ${env:NAME} or ${file:PATH}: never the secret itself


class SecuritySpec(Strict):
    """How every Kafka client of a run connects: SASL (PLAIN, SCRAM) and TLS (job-spec "Real data formats")."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None  # text, ${env:NAME} or ${file:PATH}
    password: str | None = None  # ${env:NAME} or ${file:PATH} only
    ca_file: str | None = None  # PEM: the CA certificates the broker's certificate is checked against

    @field_validator("password", mode="before")
    @classmethod
    def _no_literal(cls, value: Any) -> Any:
        if value is not None and not (isinstance(value, str) and SECRET_REF.match(value)):
            raise ValueError("a secret in a job file is refused; give ${env:NAME} (an environment variable) or "
                             "${file:PATH} (a file holding it)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SecuritySpec:
        sasl = self.protocol.startswith("SASL")
        if sasl and (self.mechanism is None or self.username is None or self.password is None):
            missing = next(f for f in ("mechanism", "username", "password") if getattr(self, f) is None)
            raise ValueError(f"@{missing}: is required with protocol: {self.protocol} (mechanism, username, password)")
        if not sasl and any(getattr(self, f) is not None for f in ("mechanism", "username", "password")):
            raise ValueError(f"@mechanism: mechanism, username and password are for SASL; protocol: {self.protocol} "
                             "takes none (use SASL_PLAINTEXT or SASL_SSL)")
        if self.ca_file is not None and not self.protocol.endswith("SSL"):
            raise ValueError(f"@ca_file: is for TLS; protocol: {self.protocol} does not use it (use SSL or SASL_SSL)")
        return self


class KafkaSpec(Strict):
    bootstrap: str
    topic: str
    security: SecuritySpec | None = None
    start: dict[str, int] | str | int | None = None
    end: dict[str, int] | str | int | None = None


RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp", "headers", "seq")


TABLE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*){1,2}$")  # db.name or catalog.db.name


def _table_name(value: str | None) -> str | None:
    if value is not None and not TABLE_NAME.match(value):
        raise ValueError(f"{value!r} is not a catalog table name; give db.name or catalog.db.name")
    return value


class SourceSpec(Strict):
    format: Literal["delta", "parquet", "jsonl", "kafka"]
    path: str | None = None
    table: Annotated[str | None, AfterValidator(_table_name)] = None  # a catalog table instead of `path`
    version: int | None = None
    as_of: str | None = None
    kafka: KafkaSpec | None = None
    topic: str | None = None
    partitions: int | None = Field(default=None, gt=0)
    key: KeySpec = KeySpec()
    value: ValueSpec = ValueSpec()
    timestamp: TimestampSpec = TimestampSpec()
    order_by: str | None = None
    columns: dict[str, str] = {}
    on_error: Literal["fail", "skip"] = "fail"

    @field_validator("columns")
    @classmethod
    def _known_columns(cls, columns: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(columns) - set(RECORD_COLUMNS))
        if unknown:
            raise ValueError(f"unknown record column {unknown[0]!r}; map one of {', '.join(RECORD_COLUMNS)}")
        return columns

    @model_validator(mode="after")
    def _location(self) -> SourceSpec:
        if self.format == "kafka" and self.kafka is None:
            raise ValueError("@kafka: is required with format: kafka, e.g. {bootstrap: 127.0.0.1:9092, topic: clicks}")
        if self.table is not None and (self.format != "delta" or self.path is not None):
            raise ValueError("@table: a catalog table is a Delta table named instead of `path`: give format: delta "
                             "and table or path, not both")
        if self.format != "kafka" and not self.path and not self.table:
            raise ValueError(f"@path: is required with format: {self.format} (relative to the job file)")
        if self.version is not None and self.format != "delta":
            raise ValueError("@version: a Delta snapshot version is only allowed with format: delta")
        if self.as_of is not None and (self.format != "delta" or self.version is not None):
            raise ValueError("@as_of: a Delta snapshot by time is only allowed with format: delta, without version")
        return self


class WindowSpec(Strict):
    type: Literal["tumbling", "hopping", "sliding", "session"]
    size: Duration | None = None
    advance: Duration | None = None
    grace: int | Literal["legacy"] | None = None
    time_difference: Duration | None = None
    gap: Duration | None = None

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> Any:
        return value if value == LEGACY_GRACE else parse_duration(value)

    @model_validator(mode="after")
    def _shape(self) -> WindowSpec:
        allowed = {"tumbling": {"size", "grace"}, "hopping": {"size", "advance", "grace"},
                   "sliding": {"time_difference", "grace"}, "session": {"gap", "grace"}}[self.type]
        given = {f for f in ("size", "advance", "time_difference", "gap") if getattr(self, f) is not None}
        extra = sorted(given - allowed)
        if extra:
            raise ValueError(f"@{extra[0]}: is not a field of a {self.type} window; it takes {', '.join(sorted(allowed))}")
        for name in sorted(allowed - {"grace"}):
            if getattr(self, name) is None:
                raise ValueError(f"@{name}: is required for a {self.type} window (e.g. {name}: 5m)")
        if self.grace is None:
            raise ValueError("@grace: is required (Kafka Streams 4 has no default): give e.g. 30s, 0ms for none, "
                             "or `legacy` for the pre-3.0 default of 24h minus the window size")
        _check_window_values(self)
        return self

    @property
    def size_ms(self) -> int:
        """Window size S (tumbling/hopping)."""
        return int(self.size or 0)

    @property
    def advance_ms(self) -> int:
        """Advance A; tumbling windows advance by their size."""
        return int(self.advance if self.advance is not None else self.size or 0)

    @property
    def grace_ms(self) -> int:
        """Grace G; `legacy` is the deprecated default max(24h - size, 0) (docs/semantics.md §4.6)."""
        if self.grace == LEGACY_GRACE:
            extent = self.size or self.gap or self.time_difference or 0
            return max(DAY_MS - extent, 0)
        return int(self.grace or 0)


def _check_window_values(w: WindowSpec) -> None:
    """TimeWindows/SlidingWindows/SessionWindows constructor rules (docs/semantics.md §4.1, §10.1, §11.1)."""
    if w.type in ("tumbling", "hopping"):
        if w.size_ms <= 0:
            raise ValueError(f"@size: must be > 0, got {w.size_ms}ms")
        if not 0 < w.advance_ms <= w.size_ms:
            raise ValueError(f"@advance: must be > 0 and <= size ({w.size_ms}ms), got {w.advance_ms}ms")
    if w.type == "sliding" and w.grace == LEGACY_GRACE:
        raise ValueError("@grace: sliding windows have no legacy default (SlidingWindows always took a grace); "
                         "give a duration, e.g. 30s or 0ms")
    if w.type == "sliding" and (w.time_difference or 0) <= 0:
        raise ValueError("@time_difference: must be > 0 (0 would build windows with start == end)")
    if w.type == "session" and (w.gap or 0) <= 0:
        raise ValueError("@gap: must be > 0")
    if w.grace != LEGACY_GRACE and int(w.grace or 0) < 0:
        raise ValueError(f"@grace: must be >= 0, got {w.grace}ms")


class FoldSpec(Strict):
    init: str
    step: str
    merge: str | None = None


class FoldAggregation(Strict):
    fold: FoldSpec


Aggregation = str | FoldAggregation


class GroupBySpec(Strict):
    """A re-key before the aggregate (docs/semantics.md §13): `KStream#groupBy` and its repartition topic."""

    key: str = Field(min_length=1)  # Spark SQL over the record: the new key
    # how the new key is serialized for the partitioner (default: by its type: string, int, long, bytes); avro:
    # the registry's wire format with `schema_id` (a primitive Avro key: string, long, int, boolean, double)
    format: Literal["string", "long", "int", "bytes", "avro"] | None = None
    schema_id: int | None = Field(default=None, ge=0)
    partitions: int | None = Field(default=None, gt=0)  # the repartition topic's (default: the input's)

    @model_validator(mode="after")
    def _schema_id(self) -> GroupBySpec:
        if (self.format == "avro") != (self.schema_id is not None):
            raise ValueError("@schema_id: format: avro hashes the registry's wire format, header included: give the "
                             "subject's schema id (schema_id: N), and schema_id only with format: avro")
        return self


def _on_off(value: Any) -> Any:
    """YAML 1.1 reads `on` and `off` as booleans."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _group_by(value: Any) -> Any:
    return {"key": value} if isinstance(value, str) else value


Where = Annotated[str, Field(min_length=1)]  # a Spark SQL boolean over the record (KStream#filter)


class AggregateSpec(Strict):
    input: str
    where: Where | None = None  # KStream#filter before the operator (and before group_by's re-key)
    group_by: Annotated[GroupBySpec | None, BeforeValidator(_group_by)] = None
    window: WindowSpec | None = None  # none: KGroupedStream#aggregate, a table (docs/semantics.md §16)
    aggregations: dict[str, Aggregation] = Field(min_length=1)
    emit: Literal["updates", "final"] = "updates"
    # emit: final: which of Kafka Streams' two mechanisms the application uses (docs/semantics.md §4.5)
    close: Literal["suppress", "on_window_close"] | None = None
    # the application's record cache for this store (docs/semantics.md §14); YAML reads on/off as booleans
    cache: Annotated[Literal["on", "off"], BeforeValidator(_on_off)] = "off"

    @property
    def close_mechanism(self) -> str:
        """The final mechanism: `close`, else on_window_close (what every job before `close` existed meant)."""
        return self.close or "on_window_close"

    @model_validator(mode="after")
    def _close_with_final(self) -> AggregateSpec:
        if self.close is not None and self.emit != "final":
            raise ValueError("@close: only with emit: final (an update stream forwards every update; close names "
                             "how final windows are emitted: suppress or on_window_close)")
        return self

    @model_validator(mode="after")
    def _table_never_closes(self) -> AggregateSpec:
        if self.window is None and self.emit == "final":
            raise ValueError("@emit: an aggregate without a window is a table, which never closes, so it has no "
                             "final rows; use emit: updates (every update), or give a window")
        return self

    @field_validator("aggregations")
    @classmethod
    def _names(cls, aggs: dict[str, Aggregation]) -> dict[str, Aggregation]:
        reserved = {"key", "window_start", "window_end", "ts", "emit_seq", "task"}
        for name in aggs:
            if name in reserved or not name.isidentifier():
                raise ValueError(f"aggregation name {name!r} is reserved or not an identifier; "
                                 f"use letters, digits and _ and none of {', '.join(sorted(reserved))}")
        return aggs


class JoinWindowSpec(Strict):
    before: Duration
    after: Duration
    grace: Duration | None = None

    @model_validator(mode="after")
    def _bounds(self) -> JoinWindowSpec:
        if self.before + self.after < 0:
            raise ValueError("@before: before + after must be >= 0 (either side may be negative, not both)")
        if self.grace is not None and self.grace < 0:
            raise ValueError("@grace: must be >= 0")
        return self


class JoinGroupBy(Strict):
    """A re-key of one or both join inputs (`selectKey` before the join): each gets a repartition topic."""

    left: Annotated[GroupBySpec | None, BeforeValidator(_group_by)] = None
    right: Annotated[GroupBySpec | None, BeforeValidator(_group_by)] = None

    @model_validator(mode="after")
    def _some(self) -> JoinGroupBy:
        if self.left is None and self.right is None:
            raise ValueError("@left: give left, right or both (a new key expression or {key, format, partitions})")
        return self


def _join_group_by(value: Any) -> Any:
    """A bare expression or {key, ...}: both sides get that new key."""
    if isinstance(value, str) or (isinstance(value, dict) and "key" in value):
        return {"left": value, "right": value}
    return value


class JoinWhere(Strict):
    """KStream#filter on each side before the join (either optional)."""

    left: Where | None = None
    right: Where | None = None


class VersionedSpec(Strict):
    """A versioned table (KIP-914, Kafka Streams 3.5+): the value as of the stream record's timestamp."""

    history_retention: Duration
    grace: Duration = 0

    @model_validator(mode="after")
    def _bounds(self) -> VersionedSpec:
        if self.history_retention < 0 or self.grace < 0:
            raise ValueError("@history_retention: history_retention and grace must be >= 0")
        if self.grace > self.history_retention:
            raise ValueError("@grace: must not exceed history_retention (Kafka Streams refuses a join grace longer "
                             "than the table's history)")
        return self


class JoinSpec(Strict):
    left: str
    right: str | None = None  # a stream: KStream-KStream join
    table: str | None = None  # a table: KStream-KTable join (the latest value per key)
    group_by: Annotated[JoinGroupBy | None, BeforeValidator(_join_group_by)] = None
    how: Literal["inner", "left", "outer"] = "inner"
    window: JoinWindowSpec | None = None
    eager: bool = False
    value: str
    where: JoinWhere | None = None
    versioned: VersionedSpec | None = None

    @model_validator(mode="after")
    def _grace(self) -> JoinSpec:
        if (self.right is None) == (self.table is None):
            raise ValueError("@right: a join reads right (a stream, with a window) or table (a table), not both "
                             "and not neither")
        if self.table is not None:
            for name, given in (("window", self.window is not None), ("eager", self.eager)):
                if given:
                    raise ValueError(f"@{name}: a stream-table join takes no {name} (the table holds the latest "
                                     "value per key); remove it")
            if self.group_by is not None and self.group_by.right is not None:
                raise ValueError("@group_by: a table is not re-keyed (a KTable has no selectKey); re-key the stream "
                                 "only: group_by: {left: EXPR}")
            if self.how == "outer":
                raise ValueError("@how: a stream-table join is inner or left (KStream#join / leftJoin(KTable))")
            return self
        if self.versioned is not None:
            raise ValueError("@versioned: only a table is versioned; use table: instead of right:")
        if self.window is None:
            raise ValueError("@window: is required for a stream-stream join, e.g. {before: 10m, after: 1m, "
                             "grace: 5m}")
        if self.window.grace is None and not self.eager:
            raise ValueError("@window.grace: is required unless eager: true (then it defaults as JoinWindows.of did)")
        return self

    @property
    def other(self) -> str:
        """The second input: the right stream or the table."""
        return self.right if self.right is not None else str(self.table)


class RulesSpec(Strict):
    """The lookback rule engine (docs/semantics.md §12): per transaction and rule, an aggregate over [t - W, t]."""

    input: str
    rules: str
    where: Where | None = None  # a filter on the transactions before the rules see them
    # t of the window: `value.<field>` (a JSON integer of epoch ms) or `timestamp` (the record's own)
    event_time: str = "timestamp"
    order: Literal["arrival", "event_time"] = "arrival"
    rule_versions: Literal["as_of_arrival", "final"] = "as_of_arrival"
    compat: Literal["intended", "demo"] = "intended"
    # the live job's watermark: the largest event time seen minus this (the demo's legacy extractor), used by
    # the state cleanup timers of order: arrival
    out_of_orderness: Duration = 500

    @field_validator("event_time")
    @classmethod
    def _event_time(cls, value: str) -> str:
        if value != "timestamp" and not (value.startswith("value.") and value[6:].isidentifier()):
            raise ValueError(f"event_time {value!r}: use value.<field> (a field of the transaction holding epoch "
                             "ms, e.g. value.eventTime) or timestamp (the record timestamp)")
        return value

    @field_validator("out_of_orderness")
    @classmethod
    def _bound(cls, value: int) -> int:
        if value < 0:
            raise ValueError("out_of_orderness must be >= 0")
        return value

    @model_validator(mode="after")
    def _two_sources(self) -> RulesSpec:
        if self.input == self.rules:
            raise ValueError("@rules: the rule messages come from their own source, not the transactions'")
        return self


class OperatorSpec(Strict):
    name: str
    aggregate: AggregateSpec | None = None
    join: JoinSpec | None = None
    rules: RulesSpec | None = None
    # the job's source names, set by JobSpec: an input that names a source reads the source, even where an
    # operator has that name too (a job written before chains, docs/semantics.md §18)
    _sources: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @model_validator(mode="after")
    def _one_kind(self) -> OperatorSpec:
        kinds = [k for k in ("aggregate", "join", "rules") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("an operator has `name` and exactly one of: aggregate, join, rules")
        return self

    @property
    def kind(self) -> str:
        """Operator kind: aggregate, join or rules."""
        return "aggregate" if self.aggregate is not None else "join" if self.join is not None else "rules"

    @property
    def processor(self) -> str:
        """Which processor runs it, the key both engines' registries dispatch on: join, table_join (a join with
        `table:`, docs/semantics.md §17), rules, the aggregate's window type (tumbling, hopping, sliding,
        session) or table (an aggregate without a window, §16)."""
        if self.join is not None:
            return "join" if self.join.table is None else "table_join"
        if self.rules is not None:
            return "rules"
        assert self.aggregate is not None
        return self.aggregate.window.type if self.aggregate.window is not None else "table"

    @property
    def inputs(self) -> list[str]:
        """Names of the sources (or the operator, docs/semantics.md §18) this operator reads."""
        if self.aggregate is not None:
            return [self.aggregate.input]
        if self.rules is not None:
            return [self.rules.input, self.rules.rules]
        assert self.join is not None
        return [self.join.left, self.join.other]

    def reads_source(self, name: str) -> bool:
        """Whether the input `name` is one of the job's sources (then never an operator of that name)."""
        return name in self._sources


class SinkSpec(Strict):
    format: Literal["delta", "parquet", "jsonl", "none"]
    path: str | None = None
    table: Annotated[str | None, AfterValidator(_table_name)] = None  # a catalog table instead of `path`

    @model_validator(mode="after")
    def _path(self) -> SinkSpec:
        if self.table is not None and (self.format != "delta" or self.path is not None):
            raise ValueError("@table: a catalog table is a Delta table named instead of `path`: give format: delta "
                             "and table or path, not both")
        if self.format == "none" and self.path is not None:
            raise ValueError("@path: a sink with format: none writes nothing; remove path or pick a format")
        if self.format != "none" and not self.path and not self.table:
            raise ValueError(f"@path: is required with format: {self.format} (relative to the job file)")
        return self

    @property
    def writes(self) -> bool:
        """False for `format: none` (the operator's output is only counted)."""
        return self.format != "none"


class VerifySpec(Strict):
    """How `backfill verify` reads the streaming output of one operator (CLI options override)."""

    against: str | None = None  # table, path or path@version, relative to the job file
    # an output topic's inner key (in the windowed key) and value formats; default: the input's key format, JSON
    key: KeySpec | None = None
    value: ValueSpec | None = None
    columns: dict[str, str] = {}  # our column: the streaming output's column (--map col=source_col)
    tolerance: dict[str, str] = {}  # column: abs:0.01 | rel:1e-6 | abs:0.01,rel:1e-6 (--tolerance)


class ScheduleSpec(Strict):
    """When a scheduled run (`backfill run --due`) publishes: intervals of `interval`, each once its data is complete.

    An interval [s, s + interval) is due when the clock has passed its end + `lag` and every source has data
    past that point; `lag` is at least what the operators need before an interval's outputs are final
    (checked when the plan is built). Intervals start at `start` (ISO-8601 or epoch ms) and every `interval`
    after it; without `start`, at multiples of `interval` since the epoch, from the first published or the
    first record's interval.
    """

    interval: Duration
    lag: Duration = 0
    start: str | int | None = None
    # a scheduler's lock whose holder has not renewed it for this long is stale (the holder died)
    lock_timeout: Duration = 600_000

    @model_validator(mode="after")
    def _values(self) -> ScheduleSpec:
        if self.interval <= 0:
            raise ValueError("@interval: must be > 0, e.g. interval: 1h")
        if self.lag < 0:
            raise ValueError("@lag: must be >= 0 (how long after an interval ends its data is complete), e.g. 15m")
        if self.lock_timeout < 60_000:
            raise ValueError("@lock_timeout: must be at least 1m (a live run renews its lock every 20 s)")
        if self.start is not None:
            self.start_ms  # noqa: B018 - validates
        return self

    @property
    def start_ms(self) -> int | None:
        """`start` as epoch ms (None: aligned to the epoch)."""
        if self.start is None:
            return None
        try:
            return parse_instant(self.start)
        except ValueError:
            raise ValueError(f"@start: {self.start!r} is not an instant; {INSTANT_HINT}") from None


class JobSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    semantics: Literal["kafka-streams", "flink"] = "kafka-streams"
    # the Kafka Streams release line whose rules the job reproduces (versions.py); None: the current line
    kafka_streams: str | None = None
    sources: dict[str, SourceSpec] = Field(min_length=1)
    operators: list[OperatorSpec] = Field(min_length=1)
    sinks: dict[str, SinkSpec] = {}
    verify: dict[str, VerifySpec] = {}
    schedule: ScheduleSpec | None = None

    @field_validator("kafka_streams", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # `kafka_streams: 3.6` unquoted is a YAML number
        if value is not None:
            versions.parse(str(value))
        return value

    @model_validator(mode="after")
    def _references(self) -> JobSpec:
        names = [op.name for op in self.operators]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"@operators: operator name {dupes[0]!r} is used twice; operator names must be unique")
        for i, op in enumerate(self.operators):
            op._sources = frozenset(self.sources)
            for src in op.inputs:
                if src not in self.sources and src not in names:
                    raise ValueError(f"@operators[{i}].{op.kind}: {op.name!r} reads {src!r}, which is neither a "
                                     f"source nor an operator; sources are: {', '.join(self.sources)}; operators "
                                     f"are: {', '.join(names)}")
        allowed = set(names) | {"_ledger", "_runs"}
        if "_runs" in self.sinks and self.sinks["_runs"].format not in ("delta", "jsonl"):
            raise ValueError("@sinks._runs.format: the runs table is a delta table or a .jsonl file")
        for sink in self.sinks:
            if sink not in allowed:
                raise ValueError(f"@sinks.{sink}: no operator of that name; sinks are named after an operator, "
                                 f"_ledger or _runs ({', '.join(sorted(allowed))})")
        for name in self.verify:
            if name not in names:
                raise ValueError(f"@verify.{name}: no operator of that name ({', '.join(names)})")
        return self

    def operator(self, name: str) -> OperatorSpec:
        """The operator called `name`."""
        return next(op for op in self.operators if op.name == name)
