"""The S3 gateway (issue 27) with boto3 as the client, in one run, against two peers started
side by side: a bare streaming endpoint on the same HTTP stack (benchmarks/
s3_bare_endpoint.py: no auth, no metadata — the floor) and moto's S3 server (a Python S3
server), and the bare endpoint again with the gateway's durability (`--fsync`: a PUT's
file and directory fsynced), to show what of a PUT's gap is the fsync. Rows: 64 MiB PUT and
GET throughput (one object per client), 4 KiB PUT and GET
operations per second, each with 8 concurrent boto3 clients. Targets: the gateway >= 0.5x
the bare endpoint and >= 1.0x moto.

The gateway runs as users run it: `quarry up` with auth on (every service a process of its own,
branch-manager with a worker process per core), three times: as configured by default (a
credential's signatures checked with the scoped key Auth returned,
QUARRY_S3_GATEWAY_CACHE_SECONDS; the gateway one process), with two gateway worker processes
(QUARRY_S3_GATEWAY_WORKERS=2), and with that cache off (every request asks Auth and looks its
repository and branch up again), so one run shows what the workers and the cache buy. The
clients are this process alone, for every peer (an in-process suite here would share the
clients' interpreter lock and measure that instead).
Sizes: BENCH_S3_BIG_MIB (64), BENCH_S3_SMALL_OPS (800 per row), BENCH_S3_CLIENTS (8).

Memory: no big body is held whole here: each PUT streams the object from a file on disk
(botocore reads it in pieces), each GET reads its answer in 1 MiB pieces. Printed per
peer: the peak resident memory (VmHWM) of its server process (with workers, the supervisor's
and every worker's, summed), and of this process (the 8 clients); the load average before and
after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.auth import AUTH_ENV
from support.processes import free_port
from support.wait import wait_until

BIG_MIB = int(os.environ.get("BENCH_S3_BIG_MIB", "64"))
SMALL_OPS = int(os.environ.get("BENCH_S3_SMALL_OPS", "800"))
CLIENTS = int(os.environ.get("BENCH_S3_CLIENTS", "8"))
os.environ.update(AUTH_ENV)


def _client(endpoint: str, keys: tuple[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=4,
            retries={"max_attempts": 1},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def _parallel(clients, work) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(work, range(len(clients))))
    return time.perf_counter() - started


def _big_file() -> str:
    """A file of BIG_MIB random MiB (written once per run, 1 MiB at a time): the big PUTs'
    body, streamed from disk rather than held in memory."""
    if not _BIG_FILE:
        handle, path = tempfile.mkstemp(prefix="quarry-bench-big-")
        with os.fdopen(handle, "wb") as out:
            for _ in range(BIG_MIB):
                out.write(os.urandom(1024 * 1024))
        _BIG_FILE.append(path)
        _TEMP_FILES.append(path)
    return _BIG_FILE[0]


_BIG_FILE: list[str] = []
_TEMP_FILES: list[str] = []


def peak_rss_mib(pid: int | None = None) -> float:
    """The peak resident memory (VmHWM) of a process (this one by default), in MiB."""
    with open(f"/proc/{pid or 'self'}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def server_peak_rss_mib(pid: int) -> float:
    """A server's peak resident memory: its process's and, for a supervisor of worker
    processes, every worker's, summed."""
    from support.processes import children_of

    return sum(peak_rss_mib(p) for p in [pid, *children_of(pid)])


def measure(
    name: str, endpoint: str, keys: tuple[str, str], bucket: str, prefix: str, pid: int
) -> dict:
    """The four rows against one peer, then the peak memory of its process `pid`."""
    clients = [_client(endpoint, keys) for _ in range(CLIENTS)]
    big = _big_file()
    small = os.urandom(4096)
    per = max(1, SMALL_OPS // CLIENTS)
    rows = {}

    def put_big(i):
        with open(big, "rb") as body:
            clients[i].put_object(Bucket=bucket, Key=f"{prefix}big/{i}", Body=body)

    def get_big(i):
        body = clients[i].get_object(Bucket=bucket, Key=f"{prefix}big/{i}")["Body"]
        while body.read(1 << 20):
            pass

    def put_small(i):
        for n in range(per):
            clients[i].put_object(Bucket=bucket, Key=f"{prefix}small/{i}/{n}", Body=small)

    def get_small(i):
        for n in range(per):
            clients[i].get_object(Bucket=bucket, Key=f"{prefix}small/{i}/{n}")["Body"].read()

    total_mib = BIG_MIB * CLIENTS
    rows[f"{BIG_MIB}MiB PUT MiB/s"] = total_mib / _parallel(clients, put_big)
    rows[f"{BIG_MIB}MiB GET MiB/s"] = total_mib / _parallel(clients, get_big)
    rows["4KiB PUT ops/s"] = per * CLIENTS / _parallel(clients, put_small)
    rows["4KiB GET ops/s"] = per * CLIENTS / _parallel(clients, get_small)
    print(
        f"  {name:<10} "
        + "  ".join(f"{k}: {v:8.1f}" for k, v in rows.items())
        + f"  peak RSS: server {server_peak_rss_mib(pid):.0f} MiB,"
        + f" clients {peak_rss_mib():.0f} MiB",
        flush=True,
    )
    return rows


def _process(args: list[str], endpoint: str, env=None) -> subprocess.Popen:
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def up() -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    wait_until(up, timeout=60, interval=0.1, what=f"{args[0]} to answer")
    return child


@contextlib.contextmanager
def gateway_of_up(home: Path, extra_env: dict[str, str]):
    """`quarry up` in `home` on free ports, the test admin set up, repository "bench" made:
    (endpoint, the admin's new S3 credentials, the s3-gateway process's pid)."""
    import signal

    from quarry.cli.services import SERVICE_MODULES
    from quarry.client import Client, Credentials
    from support.auth import setup_admin_over_grpc
    from support.processes import VENV_BIN, children_of, quarry_env, service_ports

    ports = {name: free_port() for name in SERVICE_MODULES}
    env = quarry_env(
        home,
        **service_ports(ports),
        **extra_env,
    )
    with open(home / "up.log", "wb") as log:
        up = subprocess.Popen(
            [str(VENV_BIN / "quarry"), "up"],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{ports['s3-gateway']}"
    try:
        wait_until(
            lambda: _answers(endpoint + "/_health"),
            timeout=120,
            interval=0.2,
            what="quarry up's s3-gateway to answer",
        )
        bm, committer = (f"127.0.0.1:{ports[n]}" for n in ("branch-manager", "committer"))
        setup_admin_over_grpc(bm)
        # The suite's admin (quarry_env's credentials), whatever the caller's environment.
        admin = Credentials(env["QUARRY_ACCESS_KEY_ID"], env["QUARRY_SECRET_ACCESS_KEY"])
        with Client(bm, committer, credentials=admin) as client:
            wait_until(
                lambda: _repository_made(client, home),
                timeout=60,
                interval=0.2,
                what="the suite to take a repository",
            )
            made = client.create_credentials("admin")
        keys = (made.credentials.access_key_id, made.secret_access_key)
        gateway = [
            pid
            for pid in children_of(up.pid)
            if "s3-gateway" in Path(f"/proc/{pid}/cmdline").read_text()
        ]
        yield endpoint, keys, gateway[0]
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _repository_made(client, home: Path) -> bool:
    """Repository "bench" exists (made now, or already); False while the suite warms up."""
    import grpc

    try:
        client.create_repository("bench", str(home / "lake" / "bench"))
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
            return True
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return False
        raise
    return True


def main() -> None:
    print(f"  load average before: {os.getloadavg()[0]:.1f}", flush=True)
    try:
        _run()
    finally:
        # The objects written (hundreds of MiB) are not kept.
        for directory in _TEMP_DIRS:
            shutil.rmtree(directory, ignore_errors=True)
        for path in _TEMP_FILES:
            with contextlib.suppress(OSError):
                os.unlink(path)
    print(f"  load average after: {os.getloadavg()[0]:.1f}", flush=True)


_TEMP_DIRS: list[str] = []


def _run() -> None:
    bin_dir = Path(sys.executable).parent
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-s3-"))
    _TEMP_DIRS.append(str(home))
    results = {}
    # The gateway as configured by default (one process); with two worker processes
    # (QUARRY_S3_GATEWAY_WORKERS=2: what the workers buy on this machine); and with
    # QUARRY_S3_GATEWAY_CACHE_SECONDS=0 (every request asks Auth/VerifySignature and looks the
    # repository and branch up again: what each request cost before the cache), each in
    # front of a suite of its own.
    for name, env in (
        ("gateway", {}),
        ("2-workers", {"QUARRY_S3_GATEWAY_WORKERS": "2"}),
        ("no-cache", {"QUARRY_S3_GATEWAY_CACHE_SECONDS": "0"}),
    ):
        (home / name).mkdir()
        with gateway_of_up(home / name, env) as (endpoint, keys, pid):
            results[name] = measure(name, endpoint, keys, "bench", "main/", pid)
    # The floor, and the floor with the gateway's durability (a PUT's file and directory
    # fsynced): what of the gap is the fsync a gateway PUT must not skip.
    for name, extra in (("bare", []), ("bare-fsync", ["--fsync"])):
        bare_port = free_port()
        bare_dir = tempfile.mkdtemp(prefix="quarry-bench-bare-")
        _TEMP_DIRS.append(bare_dir)
        bare = _process(
            [sys.executable, str(HERE / "s3_bare_endpoint.py"), str(bare_port), bare_dir, *extra],
            f"http://127.0.0.1:{bare_port}/",
        )
        try:
            endpoint = f"http://127.0.0.1:{bare_port}"
            results[name] = measure(name, endpoint, ("a", "b"), "b", "", bare.pid)
        finally:
            bare.terminate()
            bare.wait()
    moto_port = free_port()
    moto = _process(
        [str(bin_dir / "moto_server"), "-H", "127.0.0.1", "-p", str(moto_port)],
        f"http://127.0.0.1:{moto_port}/",
    )
    try:
        endpoint = f"http://127.0.0.1:{moto_port}"
        _client(endpoint, ("a", "b")).create_bucket(Bucket="bench")
        results["moto"] = measure("moto", endpoint, ("a", "b"), "bench", "", moto.pid)
    finally:
        moto.terminate()
        moto.wait()
    print(
        f"  {'row':<18} {'gateway/bare':>12} {'gateway/moto':>12} {'no-cache/bare':>13}"
        f" {'gateway/bare-fsync':>18} {'2-workers/gateway':>17}"
        "   targets (gateway) >= 0.5, >= 1.0"
    )
    for row in results["gateway"]:
        vs_bare = results["gateway"][row] / results["bare"][row]
        vs_moto = results["gateway"][row] / results["moto"][row]
        uncached = results["no-cache"][row] / results["bare"][row]
        vs_durable = results["gateway"][row] / results["bare-fsync"][row]
        workers = results["2-workers"][row] / results["gateway"][row]
        print(
            f"  {row:<18} {vs_bare:12.2f} {vs_moto:12.2f} {uncached:13.2f} {vs_durable:18.2f}"
            f" {workers:17.2f}"
        )


if __name__ == "__main__":
    main()
