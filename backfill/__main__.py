"""Part: commands. `python -m backfill`, and the file spark-submit runs (`spark-submit ... backfill/__main__.py run
JOB`): the CLI. Run as a file, Python puts this folder first on sys.path, where backfill's own modules would
shadow others of the same name (`io`, `time`, `plan`); the folder that holds the package goes there instead.
"""
from __future__ import annotations

import os
import sys

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(sys.path[0])

from backfill.cli import main  # noqa: E402  (after the path is set)

if __name__ == "__main__":
    main()
