"""Part: foundation. Job specification (the YAML contract): typed models (`models`), durations, the Kafka Streams
release profiles (`versions`) and loading with one-line errors (`load`: `load_job`, `Job`).

The package imports none of its modules, so a module of it that names another through the package
(`from backfill.jobspec import versions`) never starts a circle through here.
"""
