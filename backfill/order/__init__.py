"""Part: order. Processing order: tasks, merge keys, sequence numbers and stream time (kafka-streams.md 2)."""
