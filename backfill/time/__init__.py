"""Part: time. Timestamps: extractors and invalid-timestamp policies (kafka-streams.md 1.1)."""
