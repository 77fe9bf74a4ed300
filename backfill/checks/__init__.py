"""Part: checks. What must hold before anything is published, used by `run` (before the commit) and `verify`."""
