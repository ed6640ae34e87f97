"""Where a small PUT's and GET's CPU goes in the s3-gateway (issue 27, the 4 KiB rows of
benchmarks/s3_gateway.py), with cProfile timing CPU (time.thread_time, not wall time: on a
loaded box wall time is mostly waiting for a core).

`python benchmarks/profile_s3_gateway.py [OPS]` starts the suite in process (auth on, as
the benchmark) and the gateway as its own process under cProfile (every request's worker
thread, by HTTP method, and the event loop's thread), drives it with 8 boto3 clients doing
4 KiB PUTs, then GETs of them (OPS each, default 800), stops it and prints, for PUT and for
GET, the functions with the most CPU (own and inclusive), then the event loop's.
BENCH_S3_PROFILE_OUT: also keep the pstats files there (OUT.PUT, OUT.GET, OUT.loop).

`--serve` (internal): run the gateway under the profiler (what the driver starts).
"""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))


def _serve(out: str) -> None:
    """The gateway (services/s3_gateway/service.py serve) with one cProfile per thread:
    each request handler's worker thread, and the event loop's (main) thread."""
    import cProfile
    import threading

    from quarry.config import load_settings
    from quarry.s3gateway import app as app_module
    from quarry.services.s3_gateway.service import serve

    profiles: dict[str, list[cProfile.Profile]] = {}
    local = threading.local()
    handle = app_module.S3App._handle

    def profiled(self, scope, bridge):  # type: ignore[no-untyped-def]
        # One profile per thread and HTTP method, each timing its own thread's CPU.
        mine = getattr(local, "profiles", None)
        if mine is None:
            mine = local.profiles = {}
        method = scope["method"]
        profile = mine.get(method)
        if profile is None:
            profile = mine[method] = cProfile.Profile(time.thread_time)
            profiles.setdefault(method, []).append(profile)
        profile.enable()
        try:
            return handle(self, scope, bridge)
        finally:
            profile.disable()

    app_module.S3App._handle = profiled  # type: ignore[method-assign]
    loop_profile = cProfile.Profile(time.thread_time)
    loop_profile.enable()
    try:
        serve(load_settings())
    finally:
        loop_profile.disable()
        loop_profile.dump_stats(out + ".loop")
        for method, of_method in profiles.items():
            stats = pstats.Stats(of_method[0])
            for profile in of_method[1:]:
                stats.add(profile)
            stats.dump_stats(f"{out}.{method}")


def main() -> None:
    from s3_gateway import AUTH_ENV, CLIENTS, _client

    from support.processes import VENV_BIN, free_port, quarry_env
    from support.suite import running_suite
    from support.wait import wait_until

    os.environ.update(AUTH_ENV)
    ops = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    home = Path(tempfile.mkdtemp(prefix="quarry-profile-s3-"))
    out = os.environ.get("BENCH_S3_PROFILE_OUT") or str(home / "gateway.pstats")
    with running_suite(home) as suite:
        with suite.client() as client:
            client.create_repository("bench", suite.namespace("bench"))
            made = client.create_credentials("admin")
        keys = (made.credentials.access_key_id, made.secret_access_key)
        port, metrics = free_port(), free_port()
        env = quarry_env(
            home,
            QUARRY_S3_GATEWAY_PORT=str(port),
            QUARRY_METRICS_BASE_PORT=str(metrics - 5),
            QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
            QUARRY_COMMITTER_ADDRESS=suite.targets["committer"],
            QUARRY_LOG_LEVEL="WARNING",
        )
        child = subprocess.Popen(
            [str(VENV_BIN / "python"), __file__, "--serve", out],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        endpoint = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                import urllib.request

                try:
                    with urllib.request.urlopen(endpoint + "/_health", timeout=1):
                        return True
                except OSError:
                    return False

            wait_until(up, timeout=60, interval=0.1, what="the profiled gateway")
            clients = [_client(endpoint, keys) for _ in range(CLIENTS)]
            small = os.urandom(4096)
            per = max(1, ops // CLIENTS)

            def put_small(i: int) -> None:
                for n in range(per):
                    clients[i].put_object(Bucket="bench", Key=f"main/p/{i}/{n}", Body=small)

            def get_small(i: int) -> None:
                for n in range(per):
                    clients[i].get_object(Bucket="bench", Key=f"main/p/{i}/{n}")["Body"].read()

            for name, work in (("PUT", put_small), ("GET", get_small)):
                started = time.perf_counter()
                with ThreadPoolExecutor(CLIENTS) as pool:
                    list(pool.map(work, range(CLIENTS)))
                elapsed = time.perf_counter() - started
                print(f"4 KiB {name} under cProfile: {per * CLIENTS / elapsed:.1f} ops/s")
        finally:
            child.terminate()
            child.wait(timeout=30)
    for part in ("PUT", "GET", "loop"):
        print(f"==== {part} (CPU seconds)", flush=True)
        stats = pstats.Stats(f"{out}.{part}")
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[2])
    else:
        main()
