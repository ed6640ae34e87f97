"""A local Spark session configured the way Quarry runs it on one machine (tests, benchmarks,
`quarry gc` without a cluster): loopback only, no UI, the venv's Python on the executors,
TIMESTAMP_MICROS Parquet (what range files use)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from quarry import errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkUnavailable(errors.FailedPrecondition):
    """Spark could not start here (no usable Java, the JVM died at start): the machine's
    environment, not a bug, so a clear status rather than INTERNAL."""

    reason = "SPARK_UNAVAILABLE"


def local_session(master: str = "local[2]", app_name: str = "quarry", **conf: str) -> SparkSession:
    """getOrCreate a SparkSession on `master` with Quarry's local settings plus `conf`.
    SparkUnavailable when the JVM cannot start (JAVA_HOME, java on PATH, memory)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        java = os.environ.get("JAVA_HOME") or "java on PATH"
        raise SparkUnavailable(
            f"Spark's JVM exited at start ({java}): check that Java 17+ is installed and "
            "that JAVA_HOME points at it, and that the machine has memory to spare",
            metadata={"java_home": os.environ.get("JAVA_HOME", "")},
        ) from None
