"""The jars a local Spark driver loads, in the JVM's order.

One definition for the two that must agree on it: the session (``infra.spark``) puts these
jars on the driver's class path, and the class-data sharing archive (``infra.cds``) is keyed
on exactly this list, since HotSpot maps an archive only for the class path it was trained on.
"""

from __future__ import annotations

from pathlib import Path

from infra import jars as jar_cache
from infra import udfs


def driver_class_path(home: Path, *, s3: bool = False) -> tuple[str, ...]:
    """The jars a local driver loads, in order: what its class-data sharing archive is keyed on (infra.cds).

    ``s3``: with S3A and the AWS SDK modules it needs (``TIDEMARK_STORAGE=s3``).
    """
    spark_jars = jar_cache.resolve(home, "spark")
    s3_jars = jar_cache.resolve(home, "s3").jars if s3 else []
    tidemark_jar = udfs.build(home)  # with udfs.fs_jar_path(home) beside it
    return (str(udfs.fs_jar_path(home)), *(str(j) for j in [*spark_jars.jars, *s3_jars]), str(tidemark_jar))
