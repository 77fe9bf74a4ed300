"""A large input's one pass spreads its pane groups by (task, key) before merging them into windows
(order/tasks.py spread_partitions, plan/fused.py): the same windows, ledger and counts as merging them by
task alone."""
from __future__ import annotations

from backfill.order import tasks
from tests.conftest import delta_tables

JOB = """
name: hop-final
semantics: kafka-streams
sources:
  clicks:
    format: delta
    path: ../data/bronze/clicks
    key: {format: string}
    value: {format: json, schema: ../schemas/click.json}
    timestamp: {extractor: record, on_invalid: skip}
operators:
  - name: clicks_5m_hop
    aggregate:
      input: clicks
      window: {type: hopping, size: 5m, advance: 1m, grace: 20s}
      aggregations:
        clicks: count()
        amount: sum(value.amount)
        max_amount: max(value.amount)
        spread: max(value.amount) - min(value.amount)
      emit: final
sinks:
  clicks_5m_hop: {format: delta, path: ../data/gold/clicks_5m_hop}
  _ledger: {format: delta, path: ../data/ledger/clicks}
"""


def test_pane_groups_spread_by_key_publish_what_merging_by_task_publishes(spark, monkeypatch, tmp_path):
    from rich.console import Console

    from backfill.demo import SOURCE, generate_clicks, install_job
    from backfill.execute import execute
    from backfill.plan import fused

    generate_clicks(str(tmp_path / SOURCE), n=3_000)  # 2 partitions, a few percent late, null keys
    job = install_job(tmp_path).with_name("hop.yaml")
    job.write_text(JOB)
    quiet = Console(stderr=True, quiet=True)
    spreads = []
    one_pass = fused.one_pass
    monkeypatch.setattr(fused, "one_pass", lambda *a, **k: (spreads.append(a[4] if len(a) > 4 else None),
                                                            one_pass(*a, **k))[1])
    by_task = execute(job, None, None, None, "spark", quiet, quiet=True)
    expected = delta_tables(tmp_path, ("gold/clicks_5m_hop", "ledger/clicks"))
    assert spreads == [None]  # a small input: merged by task
    monkeypatch.setattr(tasks, "CHUNKED_ABOVE", 0)
    monkeypatch.setattr(tasks, "SPREAD_BYTES", 4 << 10)
    spread = execute(job, None, None, None, "spark", quiet, quiet=True)
    assert spreads[1] > int(spark.conf.get("spark.sql.shuffle.partitions"))  # one per 4 KiB of the files
    assert delta_tables(tmp_path, ("gold/clicks_5m_hop", "ledger/clicks")) == expected
    assert expected["gold/clicks_5m_hop"] and expected["ledger/clicks"]
    keys = ("records_read", "records_processed", "ledger", "ledger_rows")
    assert {k: spread[k] for k in keys} == {k: by_task[k] for k in keys}
    assert {k: {f: v for f, v in op.items() if f != "seconds"} for k, op in spread["operators"].items()} == \
        {k: {f: v for f, v in op.items() if f != "seconds"} for k, op in by_task["operators"].items()}
