"""Part: operators. The Spark engine's operators: the Operator type (base.py), its registry, windows, aggregate, join."""
