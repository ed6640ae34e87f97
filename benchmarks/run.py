"""`make bench`: every benchmark, one run, figures as ratios to baselines from the same run."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "kv_gateway.py",
    "branch_reads.py",
    "mixed_load.py",
    "auth_overhead.py",
    "cost_table.py",
    "sharded_staging.py",
    "committer_workers.py",
    "commit_vs_git.py",
    "actions_overhead.py",
    "merge_vs_git.py",
    "range_writer_scale.py",
    "compaction_2092.py",
    "spark_write.py",
    "import_lake.py",
    "s3_gateway.py",
    "console.py",
]

if __name__ == "__main__":
    selected = sys.argv[1:] or BENCHMARKS
    for name in selected:
        print(f"== {name}", flush=True)
        # Each benchmark starts from this process's own import path: one that edits it
        # (spark_write.py drops benchmarks/, whose kv_gateway.py would shadow the service
        # package) must not hide its siblings from the ones after it.
        path = list(sys.path)
        try:
            runpy.run_path(str(HERE / name), run_name="__main__")
        finally:
            sys.path[:] = path
        print(flush=True)
