"""Ship nsqcli to a cluster's executors: the Python workers there import the data source's
classes (Spark pickles them by reference), so nsqcli must be importable on every executor.

``ship(spark)`` zips this installed nsqcli package (pure Python, ~300 KB) and adds it with
``addPyFile``: executors put it at the front of their ``sys.path``. Local masters need nothing
(the workers run this Python). Alternatives: install nsqcli on the executors' Python, or
``--py-files`` / ``spark.archives`` with a packed environment.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path


def package_zip(dest_dir: str | os.PathLike | None = None) -> str:
    """A zip of the nsqcli package (sources only), for addPyFile / --py-files."""
    import nsqcli

    root = Path(nsqcli.__file__).resolve().parent
    dest = Path(dest_dir or tempfile.mkdtemp(prefix="nsqcli-ship-"))
    path = dest / f"nsqcli-{nsqcli.__version__}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(root.rglob("*.py")):
            z.write(f, str(Path("nsqcli") / f.relative_to(root)))
    return str(path)


def is_local(master: str | None) -> bool:
    return not master or master.startswith("local")


def ship(spark, force: bool = False) -> str | None:
    """Add nsqcli to the session's executors unless the master is local (or ``force``).
    Returns the zip's path, or None when nothing had to be shipped."""
    master = spark.sparkContext.master
    if is_local(master) and not force:
        return None
    path = package_zip()
    spark.sparkContext.addPyFile(path)
    return path
