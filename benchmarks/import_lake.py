"""Zero-copy import (docs/import.md) against the floor it cannot beat: listing the source.

The four services run as `quarry serve` processes (SQLite KV, a local storage namespace);
`Committer.StartImport` is polled until COMPLETED. Figures, each from the same run:
  * import time / the time to list the same source alone (the same sorted listing the
    import uses, in this process: quarry.blob.sources.Listing). Target: <= 1.5x.
  * KV writes per import: the kv-gateway's write RPCs (SetItem, SetItemIf, BatchSetItems,
    DeleteItem, BatchDeleteItems) during the import, from its /metrics. Target: <= 50.
  * the first `ls` page (1,000 entries) and a `stat` right after the import, against the
    same calls on a branch whose objects were written by an ordinary commit.

Each source is measured in BENCH_IMPORT_ROUNDS rounds (default 3) of the bare listing then
the import, alternating in the same window; the figures are medians, with each round's
ratio and load average printed (on a shared machine the wall ratio follows the load).

Sources: a local directory of N files (BENCH_IMPORT_LOCAL, default 1,000,000; 1,000 per
directory, 0 bytes: the listing is the work, not the bytes), made once and cached under
.bench-cache/; and M objects on moto's server (BENCH_IMPORT_S3, default 100,000; moto keeps
them in memory: a process of its own is filled through moto's S3 backend, then serves them
over HTTP to both the bare listing and the import). 0 skips a source.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quarry.blob.sources import Listing, parse_source
from quarry.client import Client
from quarry.config import SERVICES as ALL_SERVICES
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

LOCAL = int(os.environ.get("BENCH_IMPORT_LOCAL", "1000000"))
# Rounds of (list alone, import), alternating in the same window: the figures are medians.
ROUNDS = int(os.environ.get("BENCH_IMPORT_ROUNDS", "3"))
S3_OBJECTS = int(os.environ.get("BENCH_IMPORT_S3", "100000"))
CACHE = Path(os.environ.get("BENCH_CACHE_DIR", HERE.parent / ".bench-cache"))
SERVICES = ["kv-gateway", "range-writer", "branch-manager", "committer"]
PER_DIR = 1000
WRITES = ("SetItem", "SetItemIf", "BatchSetItems", "DeleteItem", "BatchDeleteItems")
TARGET_RATIO = 1.5
TARGET_KV_WRITES = 50


def local_source(n: int) -> Path:
    root = CACHE / f"import-local-{n}"
    done = root / ".complete"
    if done.exists():
        return root / "lake"
    shutil.rmtree(root, ignore_errors=True)
    lake = root / "lake"
    started = time.perf_counter()
    for i in range(n):
        if i % PER_DIR == 0:
            directory = lake / f"date=2026-{i // PER_DIR:05d}"
            directory.mkdir(parents=True)
        (directory / f"part-{i:07d}.parquet").touch()
    done.touch()
    print(f"  made {n:,} files in {time.perf_counter() - started:.0f} s (cached: {root})")
    return lake


@contextmanager
def suite(home: Path, s3_endpoint: str = "") -> Iterator[tuple[Client, int, dict[str, int]]]:
    """(client, kv-gateway metrics port, pid of each service)."""
    ports = {service: free_port() for service in SERVICES}
    settings = {"QUARRY_AUTH_ENABLED": "false", "QUARRY_COMPACTOR_ENABLED": "false"}
    if s3_endpoint:
        settings["QUARRY_S3_ENDPOINT_URL"] = s3_endpoint
    for service, port in ports.items():
        prefix = f"QUARRY_{service.upper().replace('-', '_')}"
        settings[f"{prefix}_PORT"] = str(port)
        settings[f"{prefix}_ADDRESS"] = f"127.0.0.1:{port}"
    metrics_port = free_port()
    children: list[subprocess.Popen[bytes]] = []
    try:
        for service in SERVICES:
            own = dict(settings)
            if service == "kv-gateway":  # only its metrics: the KV writes are counted there
                own["QUARRY_METRICS_BASE_PORT"] = str(
                    metrics_port - ALL_SERVICES.index("kv-gateway")
                )
            env = quarry_env(home, **own)
            env.setdefault("AWS_ACCESS_KEY_ID", "bench")
            env.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "quarry.cli.main", "serve", service],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_serving(f"127.0.0.1:{ports[service]}", timeout=60)
        with Client(
            branch_manager=f"127.0.0.1:{ports['branch-manager']}",
            committer=f"127.0.0.1:{ports['committer']}",
            token="",
            timeout=600,
        ) as client:
            yield client, metrics_port, dict(zip(SERVICES, (c.pid for c in children), strict=True))
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(30)


def kv_writes(metrics_port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    total = 0.0
    for line in text.decode().splitlines():
        found = re.match(r'quarry_rpc_requests_total\{.*method="[^"]*/(\w+)".*\} (\S+)', line)
        if found and found.group(1) in WRITES:
            total += float(found.group(2))
    return int(total)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, with its children that ended (the
    committer's listing processes): /proc/PID/stat utime, stime, cutime, cstime."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def time_listing(uri: str, settings: object = None) -> tuple[float, int, float]:
    """(wall seconds, objects, CPU seconds) of the bare listing, in this process."""
    started, cpu = time.perf_counter(), time.process_time()
    count = sum(1 for _ in Listing(parse_source(uri), settings))  # type: ignore[arg-type]
    return time.perf_counter() - started, count, time.process_time() - cpu


def reads(client: Client, repo: str, ref: str, path: str) -> tuple[float, float, float]:
    """Medians of 5: the first page of `ls` (1,000 entries), a stat, and a commit of one
    change (a put and the commit)."""
    pages, stats, commits = [], [], []
    for i in range(5):
        started = time.perf_counter()
        client.put_object(repo, ref, path=f"{path}.one-{i}", physical_address=f"/one/{i}")
        client.commit(repo, ref, f"one change {i}")
        commits.append(time.perf_counter() - started)
        started = time.perf_counter()
        client.list_objects(repo, ref, page_size=1000)
        pages.append(time.perf_counter() - started)
        started = time.perf_counter()
        client.stat_object(repo, ref, path)
        stats.append(time.perf_counter() - started)
    return statistics.median(pages), statistics.median(stats), statistics.median(commits)


def run_import(
    client: Client,
    metrics_port: int,
    pids: dict[str, int],
    uri: str,
    expected: int,
    repo: str = "bench",
) -> tuple[float, int, dict[str, float]]:
    """(wall seconds, KV writes, CPU seconds of the committer and the range-writer)."""
    before = kv_writes(metrics_port)
    cpu = {name: cpu_seconds(pids[name]) for name in ("committer", "range-writer")}
    started = time.perf_counter()
    status = client.start_import(repo, "main", [(uri, "lake")])
    while status.state == cm.IMPORT_STATE_RUNNING:
        # Polls every 2% of the time so far (50 ms to 1 s): a GetImportStatus costs the
        # committer ~2.5 ms of CPU, taken from the import it measures (every 50 ms, that
        # was 5% of a core for the whole import); the end is seen at most 2% late.
        time.sleep(min(1.0, max(0.05, 0.02 * (time.perf_counter() - started))))
        status = client.get_import_status(repo, status.id)
    elapsed = time.perf_counter() - started
    assert status.state == cm.IMPORT_STATE_COMPLETED, status.error
    assert status.objects_listed == expected, (status.objects_listed, expected)
    used = {name: cpu_seconds(pids[name]) - was for name, was in cpu.items()}
    return elapsed, kv_writes(metrics_port) - before, used


def report(
    name: str,
    n: int,
    rounds: list[tuple[float, float, float, dict[str, float], int, float]],
    read_figures,
) -> None:
    """`rounds`: (listing s, listing CPU s, import s, CPU s by process, KV writes, load
    average) each; the medians are reported, every round's ratio beside them."""
    for listing, listing_cpu, elapsed, cpu, writes, load in rounds:
        print(
            f"    round: list {listing:.2f} s ({listing_cpu:.2f} s CPU), import {elapsed:.2f} s, "
            f"{elapsed / listing:.2f}x; CPU committer {cpu['committer']:.2f} s, "
            f"range-writer {cpu['range-writer']:.2f} s; {writes} KV writes; load {load:.1f}"
        )
    listing = statistics.median(r[0] for r in rounds)
    listing_cpu = statistics.median(r[1] for r in rounds)
    elapsed = statistics.median(r[2] for r in rounds)
    cpu = {
        name: statistics.median(r[3][name] for r in rounds)
        for name in ("committer", "range-writer")
    }
    writes = max(r[4] for r in rounds)
    ratio = statistics.median(r[2] / r[0] for r in rounds)
    # On a machine with a core free for each, the processes overlap (the listing processes
    # stream into the committer, the committer into the range-writer): the busiest sets the
    # pace.
    busiest = max(cpu.values())
    (page, stat, commit), (page_ref, stat_ref, commit_ref) = read_figures
    print(f"  {name}: {n:,} objects, medians of {len(rounds)} rounds")
    print(
        f"    list the source alone       {listing:8.2f} s  ({n / listing:,.0f} objects/s)\n"
        f"    import (start -> COMPLETED) {elapsed:8.2f} s  ({n / elapsed:,.0f} objects/s)\n"
        f"    import / listing            {ratio:8.2f}x  (target <= {TARGET_RATIO}x: "
        f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})\n"
        f"    CPU: listing alone {listing_cpu:.2f} s; import: committer (with its listing "
        f"processes) {cpu['committer']:.2f} s, range-writer {cpu['range-writer']:.2f} s "
        f"(busiest / listing {busiest / listing_cpu:.2f}x, both / listing "
        f"{sum(cpu.values()) / listing_cpu:.2f}x)\n"
        f"    KV writes for the import    {writes:8d}   (the most of a round; target <= "
        f"{TARGET_KV_WRITES}: {'met' if writes <= TARGET_KV_WRITES else 'NOT met'})\n"
        f"    first ls page (1,000)       {page * 1000:8.1f} ms  "
        f"(a repository of 10k entries an ordinary commit wrote: {page_ref * 1000:.1f} ms)\n"
        f"    stat                        {stat * 1000:8.1f} ms  "
        f"(same branch: {stat_ref * 1000:.1f} ms)\n"
        f"    a 1-change commit after     {commit * 1000:8.1f} ms  "
        f"(same branch: {commit_ref * 1000:.1f} ms)"
    )


def measure(
    client: Client,
    metrics_port: int,
    pids: dict[str, int],
    uri: str,
    n: int,
    home: Path,
    settings=None,
) -> tuple[list[tuple[float, float, float, dict[str, float], int, float]], str]:
    """ROUNDS rounds of the bare listing then the import, alternating; each import into a
    repository of its own (a namespace of its own: an import of the same source again would
    find its range files written already, and skip writing them). (rounds, the last
    repository)."""
    rounds = []
    repo = ""
    for i in range(ROUNDS):
        repo = f"bench-{i}"
        client.create_repository(repo, str(home / f"ns-{i}"))
        listing, count, listing_cpu = time_listing(uri, settings)
        assert count == n
        elapsed, writes, cpu = run_import(client, metrics_port, pids, uri, n, repo)
        rounds.append((listing, listing_cpu, elapsed, cpu, writes, os.getloadavg()[0]))
    return rounds, repo


def baseline_reads(client: Client, namespace: str) -> tuple[float, float, float]:
    """The same reads in a repository whose 10,000 entries an ordinary commit wrote (made
    after the import is measured: the staging dropper's deletes of its tokens are KV
    writes)."""
    client.create_repository("ordinary", namespace)
    client.put_objects(
        "ordinary",
        "main",
        (
            types_pb2.Entry(path=f"ord/f{i:05d}", physical_address=f"/o/{i}", size_bytes=1)
            for i in range(10_000)
        ),
    )
    client.commit("ordinary", "main", "ordinary entries")
    return reads(client, "ordinary", "main", "ord/f05000")


def bench_local() -> None:
    lake = local_source(LOCAL)
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-import-"))
    try:
        with suite(home) as (client, metrics_port, pids):
            rounds, repo = measure(client, metrics_port, pids, str(lake), LOCAL, home)
            middle = f"lake/date=2026-{LOCAL // PER_DIR // 2:05d}/part-{LOCAL // 2:07d}.parquet"
            figures = reads(client, repo, "main", middle)
            reference = baseline_reads(client, str(home / "ns2"))  # after: not counted
        report("local directory", LOCAL, rounds, (figures, reference))
    finally:
        shutil.rmtree(home, ignore_errors=True)


# moto in a process of its own, filled through its S3 backend before it serves (a PUT over
# HTTP costs moto ~20 ms here: 100k objects would take ~40 minutes; this takes seconds). The
# import and the bare listing then both list it over HTTP, as any S3 client would.
MOTO_FILLED = """
import sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

port, count, per_dir = (int(a) for a in sys.argv[1:4])
backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
backend.create_bucket("lake", "us-east-1")
for i in range(count):
    backend.put_object("lake", f"t/date={i // per_dir:05d}/part-{i:07d}.parquet", b"")
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()
server.stop()
"""


def bench_s3() -> None:
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-c", MOTO_FILLED, str(port), str(S3_OBJECTS), str(PER_DIR)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-import-s3-"))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        print(
            f"  moto_server filled with {S3_OBJECTS:,} objects in "
            f"{time.perf_counter() - started:.0f} s (through its backend, in its own process)"
        )
        keys = [f"t/date={i // PER_DIR:05d}/part-{i:07d}.parquet" for i in range(S3_OBJECTS)]
        settings = type("S", (), {"s3_endpoint_url": endpoint, "s3_region": "us-east-1"})()
        with suite(home, endpoint) as (client, metrics_port, pids):
            rounds, repo = measure(
                client, metrics_port, pids, "s3://lake/t", S3_OBJECTS, home, settings
            )
            figures = reads(client, repo, "main", "lake/" + keys[S3_OBJECTS // 2][2:])
            reference = baseline_reads(client, str(home / "ns2"))
        report("S3 (moto_server)", S3_OBJECTS, rounds, (figures, reference))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    print("zero-copy import vs listing the source alone (docs/import.md)")
    if LOCAL:
        bench_local()
    if S3_OBJECTS:
        bench_s3()
