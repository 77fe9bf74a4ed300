"""Part: order. Processing order: tasks, merge keys, sequence numbers and stream time (docs/semantics.md §2, §3)."""
