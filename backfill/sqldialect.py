"""Part: foundation. The Spark SQL dialect both engines parse expressions with (sqlglot, no Spark needed)."""
from __future__ import annotations

from typing import ClassVar

from sqlglot.dialects.spark import Spark


class SparkSQL(Spark):
    """Spark dialect whose tokenizer reads a doubled quote inside a string as one quote, as Spark 4
    does ('it''s' is "it's"); stock sqlglot reads it as two adjacent literals ('its')."""

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES: ClassVar[list[str]] = ["\\", "'"]
