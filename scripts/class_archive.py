"""Write the driver JVM's class archive (run by scripts/setup.sh unless BACKFILL_CLASS_ARCHIVE=0; `--force`
rewrites it). Short runs use it, other drivers only with BACKFILL_CLASS_ARCHIVE=1 (docs/stack.md says why).

Starting Spark loads and verifies some 20,000 classes, and a job's first queries load thousands more. A
class archive (the JVM's class data sharing) holds them ready to map: `backfill/session.py` starts the driver
with it when asked and when it matches the JVM, pyspark and the jars. This script runs the bundled demo job on a small
generated sample in a temporary folder with a JVM that records its classes, then asks the JVM (jcmd) to
dump what it loaded. Without jcmd (a JRE), nothing is written and Spark starts as before.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(force: bool) -> int:
    from backfill.session import class_archive, driver_java_options

    archive = class_archive()
    if archive is None:
        print("class archive: no java found; skipped")
        return 0
    if archive.is_file() and not force:
        print(f"class archive: {archive} is up to date")
        return 0
    jcmd = shutil.which("jcmd", path=str(Path(os.environ["JAVA_HOME"]) / "bin")) if os.environ.get("JAVA_HOME") \
        else shutil.which("jcmd")
    if not jcmd:
        print("class archive: no jcmd (a JRE without the JDK tools); skipped, Spark starts without it")
        return 0
    started = time.time()
    os.environ["BACKFILL_SPARK_CONF"] = "spark.driver.extraJavaOptions=" + " ".join(driver_java_options(record=True))
    with tempfile.TemporaryDirectory(prefix="backfill-classes-") as tmp:
        os.chdir(tmp)
        try:
            pid = _warm_up(Path(tmp))
        except Exception as exc:  # noqa: BLE001 - an optional speed-up: setup goes on, Spark starts without it
            print(f"class archive: the warm-up run failed ({type(exc).__name__}: {str(exc)[:200]}); skipped")
            return 0
        partial = archive.with_suffix(f".{os.getpid()}.tmp")
        archive.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([jcmd, str(pid), "VM.cds", "dynamic_dump", str(partial)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0 or not partial.is_file():
            print(f"class archive: jcmd failed ({(done.stdout + done.stderr).strip()[-300:]}); skipped")
            partial.unlink(missing_ok=True)
            return 0
        for old in archive.parent.glob("*.jsa"):  # other JVMs' or jar sets' archives are never used again
            old.unlink()
        partial.rename(archive)
    print(f"class archive: {archive} ({archive.stat().st_size / 1e6:.0f} MB) in {time.time() - started:.0f} s")
    return 0


def _warm_up(work: Path) -> int:
    """Run the demo job on 2,000 generated clicks (Delta in and out, JSON values, every window kind, the
    ledger and the expectation suites); return the driver JVM's pid."""
    from rich.console import Console

    from backfill.demo import SOURCE, WORK_DIR, generate_clicks, install_job
    from backfill.execute import execute
    from backfill.session import get_spark

    out = work / WORK_DIR
    generate_clicks(str(out / SOURCE), n=2_000)
    execute(install_job(out), None, None, None, "spark", Console(stderr=True, quiet=True), quiet=True)
    return int(get_spark().sparkContext._jvm.java.lang.ProcessHandle.current().pid())


if __name__ == "__main__":
    sys.exit(main("--force" in sys.argv[1:]))
