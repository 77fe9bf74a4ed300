"""Part: job spec. What the job's expressions see of a record, declared once for both engines: a condition or
a `group_by` reads RECORD_FIELDS, a joiner reads JOINER_FIELDS of each side (`left.<f>`, `right.<f>`), a
fold's step reads FOLD_FIELDS of the record (`r.<f>`, in processing order: `seq`)."""
from __future__ import annotations

RECORD_FIELDS = ("key", "value", "ts", "timestamp", "topic", "partition", "offset", "headers")
JOINER_FIELDS = ("key", "value", "ts", "timestamp", "topic", "partition", "offset")
FOLD_FIELDS = ("seq", *RECORD_FIELDS)
