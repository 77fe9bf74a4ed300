"""Part: foundation. Job specification (the YAML contract): typed models, durations and loading with one-line errors."""
from __future__ import annotations

from backfill.jobspec.load import Job, load_job
from backfill.jobspec.models import JobSpec

__all__ = ["Job", "JobSpec", "load_job"]
