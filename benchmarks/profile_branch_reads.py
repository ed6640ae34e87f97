"""Where a StatObject's server CPU goes (issue 14, target 4): the figures behind
branch_reads.py, per process rather than per client.

Starts the suite (`quarry serve ...`, auth off, as branch_reads.py) and the two floors of
benchmarks/echo_server.py (a bare echo, and an echo with one downstream hop), then drives
each with one client and with CONCURRENCY clients and prints, per call: the calls/s, the CPU
time each server process spent (utime + stime from /proc) and the context switches of all its
threads. Linux only (/proc).

With `--py-spy DIR` (py-spy installed in the venv: `.venv/bin/pip install py-spy`, not a
project dependency) it also samples branch-manager under each load, only while a thread holds
the GIL (`--gil`: the Python work, not gRPC's C core waiting), writes the collapsed stacks to
DIR and prints the functions with the most samples (inclusive).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2, committer_pb2_grpc, types_pb2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
SERVICES = ["kv-gateway", "range-writer", "branch-manager", "committer"]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def context_switches(pid: int) -> int:
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            lines = Path(status).read_text().splitlines()
        except OSError:
            continue  # a thread that ended meanwhile
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


def load(call: Callable[[int], None], clients: int, seconds: float) -> Callable[[], int]:
    """Start `clients` threads calling `call` for `seconds`; returns a function that waits
    for them and returns the number of calls made."""
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def client(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            call(i)
            i += clients
            counts[k] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()

    def join() -> int:
        for thread in threads:
            thread.join()
        return sum(counts)

    return join


def top_frames(collapsed: Path, count: int = 25) -> list[tuple[float, str]]:
    """(share of samples, frame) of the frames with the most samples, inclusive."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        if not line.strip():
            continue
        stack, samples = line.rsplit(" ", 1)
        total += int(samples)
        frames = {re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")[1:]}
        for frame in frames:
            inclusive[frame] += int(samples)
    return [(n / max(total, 1), frame) for frame, n in inclusive.most_common(count)]


def measure(
    name: str,
    call: Callable[[int], None],
    pids: dict[str, int],
    clients: int,
    py_spy: tuple[Path, int] | None,
) -> None:
    for i in range(200):
        call(i)
    cpu_before = {n: cpu_seconds(p) for n, p in pids.items()}
    switches_before = {n: context_switches(p) for n, p in pids.items()}
    start = time.perf_counter()
    join = load(call, clients, SECONDS)
    spy = None
    if py_spy is not None:
        out = py_spy[0] / f"{name.replace(' ', '_')}_{clients}.txt"
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(py_spy[1])]
            + ["--duration", str(int(SECONDS) - 1), "--rate", "200", "--gil", "--nonblocking"]
            + ["--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    calls = join()
    elapsed = time.perf_counter() - start
    per_call = ", ".join(
        f"{n} {1e6 * (cpu_seconds(p) - cpu_before[n]) / calls:.0f} us "
        f"{(context_switches(p) - switches_before[n]) / calls:.1f} cs"
        for n, p in pids.items()
    )
    print(f"  {name:<24} {clients:>2} clients {calls / elapsed:>7,.0f} calls/s   {per_call}")
    if spy is not None:
        spy.wait()
        if out.exists():
            for share, frame in top_frames(out):
                print(f"      {100 * share:5.1f}%  {frame[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", type=Path, default=None, help="write GIL samples here")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-profile-"))
    ports = {name: free_port() for name in SERVICES}
    env = quarry_env(
        home,
        QUARRY_AUTH_ENABLED="false",
        **{f"QUARRY_{n.upper().replace('-', '_')}_PORT": str(p) for n, p in ports.items()},
        **{
            f"QUARRY_{n.upper().replace('-', '_')}_ADDRESS": f"127.0.0.1:{p}"
            for n, p in ports.items()
        },
    )
    children: dict[str, subprocess.Popen] = {}
    floors: list[subprocess.Popen] = []
    try:
        echo = subprocess.Popen(
            [sys.executable, str(HERE / "echo_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        floors.append(echo)
        echo_port = int(echo.stdout.readline())
        relay = subprocess.Popen(
            [sys.executable, str(HERE / "echo_server.py"), "--forward", str(echo_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        floors.append(relay)
        relay_port = int(relay.stdout.readline())
        for name in SERVICES:
            children[name] = subprocess.Popen(
                [sys.executable, "-m", "quarry.cli.main", "serve", name],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_serving(f"127.0.0.1:{ports[name]}")
        stub = branch_manager_pb2_grpc.BranchManagerStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['branch-manager']}")
        )
        committer = committer_pb2_grpc.CommitterStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['committer']}")
        )
        stub.CreateRepository(
            bm.CreateRepositoryRequest(name="bench", storage_namespace=str(home / "lake"))
        )
        entries = [
            types_pb2.Entry(path=f"data/f{i:05d}", physical_address=f"a/{i}", checksum=f"c{i}")
            for i in range(1000)
        ]
        stub.PutObjects(
            iter([bm.PutObjectsRequest(repository="bench", branch="main", entries=entries)])
        )
        committer.Commit(
            committer_pb2.CommitRequest(repository="bench", branch="main", message="load")
        )
        requests = [
            bm.StatObjectRequest(repository="bench", ref="main", path=f"data/f{i:05d}")
            for i in range(1000)
        ]
        payload = requests[0].SerializeToString()
        echo_call = grpc.insecure_channel(f"127.0.0.1:{echo_port}").unary_unary("/bench.Echo/Echo")
        relay_call = grpc.insecure_channel(f"127.0.0.1:{relay_port}").unary_unary(
            "/bench.Echo/Echo"
        )
        suite = {n: children[n].pid for n in ("branch-manager", "kv-gateway")}
        spy_dir = None
        if args.py_spy is not None:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            spy_dir = (args.py_spy, children["branch-manager"].pid)
        print(f"server CPU (us) and context switches (cs) per call, {SECONDS:.0f} s per load")
        for clients in (1, CONCURRENCY):
            measure("bare echo", lambda i: echo_call(payload), {"echo": echo.pid}, clients, None)
            measure(
                "echo + one hop",
                lambda i: relay_call(payload),
                {"relay": relay.pid, "echo": echo.pid},
                clients,
                None,
            )
            measure(
                "StatObject clean",
                lambda i: stub.StatObject(requests[i % 1000]),
                suite,
                clients,
                spy_dir,
            )
    finally:
        for child in children.values():
            child.terminate()
        for child in children.values():
            child.wait(20)
        for process in floors:
            process.stdin.close()
            process.wait(5)


if __name__ == "__main__":
    main()
