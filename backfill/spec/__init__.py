"""Job spec: models, durations and loading."""
from __future__ import annotations

from backfill.spec.load import Job, load_job
from backfill.spec.models import JobSpec

__all__ = ["Job", "JobSpec", "load_job"]
