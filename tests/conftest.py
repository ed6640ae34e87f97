"""Fixtures shared by every test directory: real servers the tests talk to on loopback
(dynalite for DynamoDB, moto_server for S3), each started once per session."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before anything imports grpc: importing quarry turns gRPC's fork support off
# (quarry/__init__.py); Spark sessions start their JVM from this process.
import quarry  # noqa: F401
from support.auth import AUTH_ENV, install_client_tokens
from support.processes import free_port
from support.wait import wait_until

# Auth is on in every test (the default): the fixed test signing key and admin credentials
# (support.auth) for code that reads the environment (the CLI in process, child processes).
os.environ.update(AUTH_ENV)
# A home of the run's own for code that reads the environment's (the CLI in process): the
# default, ./.quarry, is the checkout itself, which tests must never write into (the CLI's
# token cache filled it).
os.environ["QUARRY_HOME"] = tempfile.mkdtemp(prefix="quarry-test-home-")
# Child processes (the CLI, services, Spark's Python workers) log in themselves with those
# credentials, as users' processes do. Test code's own bare stubs carry the test admin's
# token (RemoteStore/RemoteRangeWriter on an address: a service token), for the whole
# session; a Client's own login header wins. Tests of authentication itself dial with
# support.auth.raw_channel.
install_client_tokens(setattr)

# Every Spark JVM of the run (the workers' sessions, `quarry gc run` and the drivers the
# tests start as children, which inherit this) compiles with C1 only and collects with the
# serial collector: the tests' JVMs live seconds to minutes on small data, where C2's
# compilations and parallel GC threads cost more CPU than they win on a 2-core machine
# (tests/e2e/test_spark_gc.py: 165 -> 103 CPU-s, 114 -> 82 s). Not the product's default:
# a user's long GC job wants C2.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DYNALITE = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "dynalite"


@contextlib.contextmanager
def _http_server(
    name: str, command: list[str], url: str, probe: str = "", timeout: float = 30.0
) -> Iterator[str]:
    """Start a server process, wait until it answers HTTP at url+probe, yield url, stop it.
    Any HTTP answer (even an error status) means it is serving."""
    # stderr to a file, never a pipe: moto_server logs a line per request, and a pipe nobody
    # reads fills after 64 KiB, then every request of the session blocks (a whole test
    # worker hung on a bucket creation).
    errors_file = tempfile.TemporaryFile()  # noqa: SIM115 — closed once the server stopped
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors_file)

    def answers() -> bool:
        if proc.poll() is not None:
            errors_file.seek(0)
            err = errors_file.read()[-4000:].decode(errors="replace")
            pytest.fail(f"{name} exited with {proc.returncode}: {err}", pytrace=False)
        try:
            urllib.request.urlopen(url + probe, timeout=1)
        except urllib.error.HTTPError:
            return True  # an error status is an answer
        except OSError:
            return False
        return True

    try:
        wait_until(answers, timeout=timeout, interval=0.05, what=f"{name} to answer on {url}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors_file.close()


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """A real dynalite (DynamoDB) server on loopback, in memory; yields its endpoint URL."""
    binary = Path(os.environ.get("QUARRY_DYNALITE", DEFAULT_DYNALITE))
    if not binary.exists():
        # A missing tool must not quietly turn DynamoDB coverage off.
        pytest.fail(
            f"dynalite not found at {binary}: run `make tools` "
            "(or set QUARRY_DYNALITE to the dynalite binary)",
            pytrace=False,
        )
    port = free_port()
    command = [
        str(binary),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--createTableMs",
        "0",
        "--deleteTableMs",
        "0",
        "--updateTableMs",
        "0",
    ]
    with _http_server("dynalite", command, f"http://127.0.0.1:{port}") as url:
        yield url


def _moto_binary() -> str | None:
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return str(beside)
    return shutil.which("moto_server")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """`moto_server -H 127.0.0.1 -p <free port>` (S3 in memory); yields its endpoint URL."""
    binary = _moto_binary()
    if binary is None:
        # A missing tool must not quietly turn S3 coverage off.
        pytest.fail("moto_server not found: install the dev extras (`make install`)", pytrace=False)
    port = free_port()
    with _http_server(
        "moto_server",
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        f"http://127.0.0.1:{port}",
        probe="/moto-api/",
    ) as url:
        yield url


@pytest.fixture
def moto_endpoint_checking_credentials(monkeypatch) -> Iterator[str]:
    """A moto_server of its own that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0):
    no made-up access key is valid there."""
    binary = _moto_binary()
    if binary is None:
        pytest.fail("moto_server not found: install the dev extras (`make install`)", pytrace=False)
    port = free_port()
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")  # read by the child at start
    with _http_server(
        "moto_server",
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        f"http://127.0.0.1:{port}",
        probe="/moto-api/",
    ) as url:
        monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
        yield url


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch) -> str:
    """A fresh bucket on the moto server (with dummy credentials in the environment)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    name = f"quarry-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every Spark test (it takes seconds to start). Two cores;
    a task may be attempted 3 times, so retry behaviour is real."""
    from quarry.spark.session import local_session

    # Executors inherit the JVM's environment, fixed when it starts: the dummy credentials
    # the S3 tests use (s3_bucket) must be there already.
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    session = local_session("local[2,3]", "quarry-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def python_writer(spark):
    """The Python workers' file writer (quarry.spark.executor) for this test: a local
    namespace's Parquet writes otherwise go through Spark's own writer (quarry.spark.native),
    where the executors make no Quarry calls; some tests inject failures, or follow traces,
    that only the Python path's task-by-task staging has."""
    from quarry.spark.native import FILE_WRITER_CONF

    spark.conf.set(FILE_WRITER_CONF, "python")
    yield
    spark.conf.unset(FILE_WRITER_CONF)


# ---- parallel runs (pytest-xdist, `make test`: -n auto --dist loadfile) --------------------
# Each module's tests run on one worker (loadfile), so a module's expensive module-scoped
# fixtures (a suite of servers, a chaos run) start once; what every test shares per process
# (dynalite, moto_server) starts once per worker; ports come from quarry.ports, race-free
# across workers. The modules that use the Spark session run on ONE worker, one after
# another (SPARK_MODULES, one work unit of the scheduler below), so a run starts one session
# JVM, not one per worker: a session costs ~20 CPU-s to start and warm up on this machine,
# and its Python workers import quarry.spark again in each JVM. (xdist's own loadgroup
# would do it with an xdist_group mark, but it does not work with pytest 9: it renames items
# through an attribute pytest no longer reads; and it spreads ungrouped tests one by one,
# which starts a module's fixtures on every worker.)
# Longest first: the Spark and end-to-end modules start before the unit tests fill the gaps.
# The podman module goes first of all: its fixture builds the image (`make test` makes only
# the base root filesystem before pytest), so the build overlaps the other workers' tests.
# xdist keeps this order only with --no-loadscope-reorder (the Makefile passes it): by default
# it hands out the modules with the most tests first, which put the Spark GC, chaos and podman
# modules (a few long tests each) at the end of the run, alone on one worker.
ORDER = ("tests/e2e/", "tests/integration/", "tests/unit/")

# Every module with a test that uses the `spark` fixture (checked at collection below).
SPARK_MODULES = frozenset(
    {
        "tests/e2e/test_spark.py",
        "tests/e2e/test_spark_gc.py",
        "tests/e2e/test_spark_s3.py",
        "tests/e2e/test_import_gc.py",
        "tests/e2e/test_observability.py",
    }
)
SPARK_WORK_UNIT = "spark session modules"
IMAGE_MODULE = "tests/e2e/test_helm_podman.py"
# Modules that mostly wait out a product deadline (a stopped worker's 60 s span timeout):
# a minute of wall each, little CPU. They start right after the Spark unit, while the other
# workers fill the cores; last in the run (integration/ sorts after e2e/), one of them kept
# its worker busy 35 s after the others had finished.
WAITING_MODULES = frozenset(
    {
        "tests/integration/test_span_processes.py",
        "tests/e2e/test_range_writer_processes.py",
    }
)


def pytest_collection_modifyitems(config, items) -> None:
    root = Path(str(config.rootpath))
    module_of = {item: Path(str(item.path)).relative_to(root).as_posix() for item in items}
    spark_modules = {module_of[item] for item in items if "spark" in item.fixturenames}
    unlisted = spark_modules - SPARK_MODULES
    if unlisted:
        # Not listed, such a module would run on another worker and start a second JVM.
        raise pytest.UsageError(
            f"{', '.join(sorted(unlisted))} use the spark fixture: add them to SPARK_MODULES "
            "in tests/conftest.py (their tests must run on the worker that has the session)"
        )

    def rank(item) -> int:
        module = module_of[item]
        if module == IMAGE_MODULE:
            return -2
        if module in SPARK_MODULES:
            return -1
        if module in WAITING_MODULES:
            return 0
        return 1 + next(
            (i for i, prefix in enumerate(ORDER) if module.startswith(prefix)), len(ORDER)
        )

    items.sort(key=rank)  # stable: the order within a module is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the Spark modules as one work unit (one worker, one JVM)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkOnOneWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return SPARK_WORK_UNIT if module in SPARK_MODULES else module

    return SparkOnOneWorker(config, log)
