"""Part: foundation. The Spark SQL dialect both engines parse expressions with (sqlglot, no Spark needed)."""
from __future__ import annotations

import re
from typing import ClassVar

from sqlglot.dialects.spark import Spark


class SparkSQL(Spark):
    """Spark dialect whose tokenizer reads a doubled quote inside a string as one quote, as Spark 4
    does ('it''s' is "it's"); stock sqlglot reads it as two adjacent literals ('its')."""

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES: ClassVar[list[str]] = ["\\", "'"]


_COUNT_EMPTY = re.compile(r"(?i)\b(count)\s*\(\s*\)")
_QUOTED = re.compile(r"""'(?:\\.|''|[^'\\])*'|"(?:\\.|[^"\\])*"|`(?:``|[^`])*`""", re.DOTALL)


def normalize_count(sql: str) -> str:
    """Rewrite the job spec's `count()` (every record, null values included; not Spark SQL) to `count(1)`,
    outside string literals and quoted identifiers. Both engines call this one rewrite."""
    out: list[str] = []
    pos = 0
    for m in _QUOTED.finditer(sql):
        out.append(_COUNT_EMPTY.sub(r"\1(1)", sql[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_COUNT_EMPTY.sub(r"\1(1)", sql[pos:]))
    return "".join(out)
