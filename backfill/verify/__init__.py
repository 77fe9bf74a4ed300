"""Part: verify. Verify: reconcile a backfill with the streaming output (causes), expectations, reports, diff."""
