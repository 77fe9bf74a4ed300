"""Part: io. Sources and sinks: files, Delta tables, Kafka topics, the runs table, locks."""
