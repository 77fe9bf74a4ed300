"""Part: plan. Plan (decide), explain (show) and evaluate (do) a backfill run, kept apart as in SQLMesh."""
