"""Part: reference engine. The job replayed one record at a time, in plain Python, as the spec reads."""
