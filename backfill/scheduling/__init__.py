"""Part: scheduling. Scheduled backfills: which intervals are due, whether their data is complete, which
published ones changed, one scheduler at a time, and running them (`backfill run --due/--restate`)."""
