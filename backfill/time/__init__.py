"""Part: time. Timestamps: extractors and invalid-timestamp policies (docs/semantics.md §1)."""
