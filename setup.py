"""Packaging beyond pyproject.toml: a wheel carries `backfill/_bundle/`, the files an installed backfill reads
without a checkout (backfill/resources.py finds them there):
- conf/ (the Spark profiles), jobs/ (the demo's jobs and samples) and schemas/;
- the jars backfill builds itself, where scripts/setup.sh has built them: its Spark operators (jvm/ops) and the
  Kafka Streams and Flink harnesses. The pinned jars of other projects are not bundled: an installed backfill
  has Spark resolve them from their Maven coordinates (`backfill setup-jars`).
An editable install (scripts/setup.sh) reads the checkout itself and gets no bundle.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
FOLDERS = ("conf", "jobs", "schemas")
OWN_JARS = ("ops/backfill-ops.jar", "harness/backfill-harness.jar", "flink-harness/backfill-flink-harness.jar")


class BuildWithBundle(build_py):
    """build_py, then the bundle beside the package's modules."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        bundle = Path(self.build_lib) / "backfill" / "_bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        for folder in FOLDERS:
            shutil.copytree(ROOT / folder, bundle / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for jar in OWN_JARS:
            built = ROOT / "jvm" / "lib" / jar
            if built.is_file():
                (bundle / "jvm" / "lib" / jar).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, bundle / "jvm" / "lib" / jar)


setup(cmdclass={"build_py": BuildWithBundle})
