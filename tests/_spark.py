"""The one SparkSession of the test session (``local[2]``, small shuffles, no UI, a temporary
warehouse), made by the ``spark`` fixture of conftest.py. Without Java the Spark tests skip,
saying what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

INSTALL_JAVA = (
    "Spark tests need Java 17: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
)


def java_ok() -> str | None:
    """None if a ``java`` runs, else why not."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "no java on PATH (nor JAVA_HOME)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{java} -version failed: {exc}"
    return None


def make_session(tmp_dir: str):
    pytest.importorskip("pyspark")
    why = java_ok()
    if why:
        pytest.skip(f"{INSTALL_JAVA} ({why})")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return (
        SparkSession.builder.master("local[2]")
        .appName("rowstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", os.path.join(tmp_dir, "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={tmp_dir}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
