"""Part: reference engine. The reference engine: the job replayed one record at a time, in plain Python, as the spec reads."""
