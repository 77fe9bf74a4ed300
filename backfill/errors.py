"""Part: foundation. One root exception; the CLI maps each kind to an exit code (0 ok, 1 differences, 2 error)."""
from __future__ import annotations


class BackfillError(Exception):
    """Base of every error a user can cause or fix; printed as one line, never as a traceback."""

    exit_code = 2


class SpecError(BackfillError):
    """The job spec is malformed: names the file, the field path, the bad value and what is allowed."""


class SourceError(BackfillError):
    """An input cannot be read, or a record is unreadable under policy `fail`."""


class OrderingError(BackfillError):
    """The processing order cannot be derived (e.g. co-partitioned inputs disagree on partition count)."""


class SessionError(BackfillError):
    """The Spark session cannot run backfill (no Delta, another time zone, no server at the address): names what is
    missing and how to set it; a session the caller gave is never changed."""


class PublishError(BackfillError):
    """Results could not be published; the target table is left as it was."""


class ExpectationsFailed(PublishError):
    """Expectations failed on what a run was about to publish: nothing was published (exit 1, as for
    differences: the data, not the job, is what fails)."""

    exit_code = 1


class VerificationFailed(BackfillError):
    """Verification found unexplained differences or failed expectations."""

    exit_code = 1


class NotImplementedYet(SpecError):
    """A spec feature that is parsed but not executable yet."""
