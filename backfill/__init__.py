"""Part: commands. backfill: re-derive what a Kafka Streams / Flink application emitted, in PySpark batch jobs."""
from __future__ import annotations

__version__ = "0.1.0"
