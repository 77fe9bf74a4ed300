"""Part: conformance. Conformance: Kafka Streams itself judges backfill's engines on random adversarial scenarios.

`scenarios` draws the scenarios and writes them as one backfill job (every scenario its own task);
`harness` replays them through Kafka Streams' TopologyTestDriver (jvm/harness, one JVM per version);
`check` runs our engines on the job and compares, scenario by scenario, and shrinks a difference to a
small job folder that reproduces it.
"""
