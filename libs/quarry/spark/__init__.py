"""Quarry for PySpark: all-or-nothing DataFrame writes from executors, reads of any ref
straight from range files, and garbage collection.

    import quarry.spark as qs

    commit = qs.write(df, "quarry://lake/main/tables/events", mode="append",
                      message="nightly load")
    df = qs.read(spark, "quarry://lake/v1.0/tables/events")        # a tag, commit or branch
    listing = qs.entries(spark, "quarry://lake/main/tables/")       # entries as a DataFrame

Where the services are: pass `connection=Connection(branch_manager, committer)`, or set
`spark.quarry.branchManager` / `spark.quarry.committer` on the session, or the QUARRY_*
settings (QUARRY_BRANCH_MANAGER_ADDRESS, QUARRY_COMMITTER_ADDRESS).
"""

from quarry.spark.common import Connection, QuarryUri, parse_uri
from quarry.spark.reader import entries, read
from quarry.spark.sweep import sweep_ephemeral_branches
from quarry.spark.writer import write

__all__ = [
    "Connection",
    "QuarryUri",
    "entries",
    "parse_uri",
    "read",
    "sweep_ephemeral_branches",
    "write",
]
