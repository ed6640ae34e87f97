"""The web console on a large branch (issue 30): the first object-browser page and the
compare page, each against the same gRPC calls made directly, in one run. Target: each page
<= 2x its direct calls (the console adds HTTP, the session, and rendering one page of HTML).

A repository of BENCH_CONSOLE_ENTRIES entries (default 1,000,000) is built on main the way
a large branch is made in practice, by a zero-copy import (Committer/StartImport) of a local
directory of that many empty files (benchmarks/import_lake.py's source, made once and cached
under .bench-cache/: a minute or two for 1M files, then seconds); a branch `feature` changes
BENCH_CONSOLE_CHANGES of them (default 1,000) over PutObjects and a commit. The suite runs in-process (tests/support/suite.py: real gRPC servers on loopback); the
console runs as users run it, `quarry serve console` in its own process dialing the suite
(tests/support/console.py `serving_console`), signed in as the test admin over HTTP (one
keep-alive connection, as a browser keeps); the direct side is a quarry.client.Client with a
token in the benchmark's process (where the suite runs: the direct side makes no hop between
processes, the console's calls do). Each figure is the median of
BENCH_CONSOLE_ROUNDS (default 30) sequential requests after a warm-up.

Rows:
- browse: GET /repos/R/objects?ref=main&prefix=lake/date=2026-00500/  vs  GetRepository + ListObjects
  (delimiter "/", 100 entries): the page's calls.
- compare: GET /repos/R/compare?left=main&right=feature  vs  GetRepository + Diff (three-dot,
  100 changes).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from import_lake import PER_DIR, local_source

from quarry.v1 import committer_pb2 as cm
from support.auth import AUTH_ENV, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY
from support.console import Browser, serving_console
from support.suite import running_suite

os.environ.update(AUTH_ENV)
ENTRIES = int(os.environ.get("BENCH_CONSOLE_ENTRIES", "1000000"))
CHANGES = int(os.environ.get("BENCH_CONSOLE_CHANGES", "1000"))
ROUNDS = int(os.environ.get("BENCH_CONSOLE_ROUNDS", "30"))
REPO = "console-bench"


def path_of(i: int) -> str:
    """The path the import gives file i of import_lake's local source (under `lake/`)."""
    return f"lake/date=2026-{i // PER_DIR:05d}/part-{i:07d}.parquet"


def changes(count: int, step: int):
    for i in range(0, count * step, step):
        path = path_of(i)
        yield {
            "path": path,
            "physical_address": f"s3://lake/{path}@v2",
            "size_bytes": 100,
            "checksum": f"sum-{path}-v2",
        }


def build(client, suite) -> None:
    """main: ENTRIES imported entries, one commit; feature: CHANGES of them changed."""
    lake = local_source(ENTRIES)
    client.create_repository(REPO, suite.namespace(REPO))
    status = client.start_import(REPO, "main", [(str(lake), "lake")])
    while status.state == cm.IMPORT_STATE_RUNNING:
        time.sleep(0.2)
        status = client.get_import_status(REPO, status.id)
    assert status.state == cm.IMPORT_STATE_COMPLETED, status.error
    assert status.objects_listed == ENTRIES, (status.objects_listed, ENTRIES)
    client.create_branch(REPO, "feature", "main")
    client.put_objects(REPO, "feature", changes(CHANGES, max(1, ENTRIES // CHANGES)), replay=False)
    client.commit(REPO, "feature", "changes")


def median_ms(call) -> float:
    call()  # warm-up
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-console-"))
    with running_suite(home) as suite, suite.client(timeout=600) as client:
        started = time.perf_counter()
        build(client, suite)
        print(
            f"  built {ENTRIES:,} entries on main, {CHANGES:,} changed on feature "
            f"in {time.perf_counter() - started:.1f}s",
            flush=True,
        )
        folder = path_of(ENTRIES // 2).rsplit("/", 1)[0] + "/"
        with serving_console(suite, home) as port:
            browser = Browser(port, keep_alive=True)
            assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303

            def page(path: str):
                def get() -> None:
                    answer = browser.get(path)
                    assert answer.status == 200, answer.text[:500]

                return get

            def direct_browse() -> None:
                client.get_repository(REPO)
                client.list_objects(REPO, "main", prefix=folder, delimiter="/", page_size=100)

            def direct_compare() -> None:
                client.get_repository(REPO)
                client.diff(REPO, "main", "feature", three_dot=True, page_size=100)

            rows = {
                "browse (first page)": (
                    median_ms(page(f"/repos/{REPO}/objects?ref=main&prefix={folder}")),
                    median_ms(direct_browse),
                ),
                "compare (first page)": (
                    median_ms(page(f"/repos/{REPO}/compare?left=main&right=feature&mode=three")),
                    median_ms(direct_compare),
                ),
            }
    print(f"  {'row':<22} {'console ms':>10} {'direct ms':>10} {'ratio':>6}   target <= 2.0")
    for name, (console_ms, direct_ms) in rows.items():
        print(f"  {name:<22} {console_ms:10.2f} {direct_ms:10.2f} {console_ms / direct_ms:6.2f}")


if __name__ == "__main__":
    main()
