"""Storage format 1 → 2 (issue 10.1: the entry identity now covers the physical address),
end to end with real processes.

A store and namespaces written by the format-1 build (tests/support/format_v1.py, a child
process running the previous format's rules through the real services) are refused by
this build — the KV stamp when a service starts, and range and metarange files when read —
with the export/import message; `quarry store export` and `quarry store import` rebuild them; this
build's services (`quarry up`) then read back every field of every entry on every branch,
tag and commit, the staged changes and the compacted branch included. Commit ids survive
the rebuild; range and metarange ids are recomputed."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quarry import FORMAT_VERSION
from quarry.blob import LocalBlobStore
from quarry.blob.ownership import MARKER_KEY, parse_marker
from quarry.client import Client
from quarry.committed.metaranges import read_metarange
from quarry.graveler.refs import REPOS_PREFIX, Repository
from quarry.kv.sqlite import SQLiteStore
from quarry.runtime import format_version
from support import format_v1
from support.auth import setup_admin_over_grpc
from support.cli import run_quarry
from support.processes import REPO_ROOT, VENV_BIN, free_port, quarry_env
from support.wait import wait_until

SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer", "compactor-sensor")


def quarry(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`quarry ARGS` (a command, not a service: its entry point in this process, as a child
    would see it, support.cli) with QUARRY_HOME `home` and `env`."""
    return run_quarry(args, quarry_env(home, **env))


@contextlib.contextmanager
def quarry_up(home: Path, kv_db: Path) -> Iterator[dict[str, str]]:
    """`quarry up` on a SQLite store (compaction off, so nothing moves under the reads);
    yields the environment that points `quarry` commands at it. Only the ports are given:
    the services and the CLI dial the addresses that follow them."""
    ports = {name: free_port() for name in SERVICES}
    env = quarry_env(
        home,
        QUARRY_KV_URL=f"sqlite:///{kv_db}",
        QUARRY_COMPACTOR_ENABLED="false",
        **{f"QUARRY_{name.upper().replace('-', '_')}_PORT": str(p) for name, p in ports.items()},
    )
    child = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its services share its group: a kill leaves none behind
    )
    try:
        seen = []

        def printed_ready() -> bool:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"quarry up stopped: {''.join(seen)} {child.stderr.read()}")
            seen.append(line)
            return "Press Ctrl-C" in line

        # A hang bound: on a loaded machine (a load average of 15) it took over 60 s.
        wait_until(printed_ready, timeout=120, interval=0, what="quarry up to start")
        # The test admin (support.auth); refused harmlessly if `quarry up` made one.
        setup_admin_over_grpc(f"127.0.0.1:{ports['branch-manager']}")
        yield env
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()


def client_for(env: dict[str, str]) -> Client:
    return Client(
        f"127.0.0.1:{env['QUARRY_BRANCH_MANAGER_PORT']}",
        f"127.0.0.1:{env['QUARRY_COMMITTER_PORT']}",
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_quarry(args, env)


def tags_of(pattern: str) -> dict[str, bytes]:
    """file name (id) -> format tag, for the files matching a glob."""
    return {
        Path(f).stem: pq.ParquetFile(f).metadata.metadata.get(b"quarry.format")
        for f in glob.glob(pattern)
    }


def range_ids_in(metarange_files: Iterator[str]) -> set[str]:
    ids: set[str] = set()
    for f in metarange_files:
        ids.update(pq.read_table(f, columns=["range_id"]).column(0).to_pylist())
    return ids


def _repo_partitions(store) -> list[bytes]:
    return [
        Repository.from_record(item.value, item.key).partition
        for item in store.scan(b"quarry", REPOS_PREFIX, REPOS_PREFIX[:-1] + b"0")
    ]


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    """The format-1 build's store, namespaces and snapshot (written once; tests copy the
    KV file when they change it, and never change the namespaces' format-1 files)."""
    root = tmp_path_factory.mktemp("format-v1")
    db, home, snap = root / "v1.db", root / "home", root / "snapshot.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",  # from tests/, where support.* is importable
            "support.format_v1",
            str(db),
            str(home),
            str(snap),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=quarry_env(root / "writer-home"),
        cwd=REPO_ROOT / "tests",
    )
    assert result.returncode == 0, result.stderr
    written = json.loads(snap.read_text())
    return {
        "db": db,
        "home": home,
        "lake": home / "lake",
        "snapshot": written["snapshot"],
        "metaranges": written["metaranges"],
    }


def test_the_writer_leaves_genuine_format_1_data(v1):
    store = SQLiteStore(v1["db"])
    try:
        assert store.get(format_version.PARTITION, format_version.KEY).value == b"1"
    finally:
        store.close()
    for repo in format_v1.REPOSITORIES:
        ranges = tags_of(f"{v1['lake']}/{repo}/_quarry/ranges/*.parquet")
        metaranges = tags_of(f"{v1['lake']}/{repo}/_quarry/metaranges/*.parquet")
        assert set(metaranges.values()) == {b"metarange/v1"}
        assert set(ranges.values()) <= {b"range/v1"}
    assert len(tags_of(f"{v1['lake']}/demo/_quarry/ranges/*.parquet")) > 3
    # A format-1 identity leaves the address out: two entries that differ only there match.
    assert format_v1.v1_entry_identity("a", 1, "", "", ()) == format_v1.v1_entry_identity(
        "b", 1, "", "", ()
    )


def test_this_build_refuses_format_1_with_the_rebuild_message(v1, tmp_path):
    # The KV store: no service starts on it (a real `quarry serve`).
    result = subprocess.run(
        [str(VENV_BIN / "quarry"), "serve", "kv-gateway"],
        capture_output=True,
        text=True,
        timeout=120,
        env=quarry_env(
            tmp_path / "home",
            QUARRY_KV_URL=f"sqlite:///{v1['db']}",
            QUARRY_KV_GATEWAY_PORT=str(free_port()),
        ),
    )
    assert result.returncode != 0
    assert "storage format version '1'" in result.stderr
    assert "quarry store export" in result.stderr and "quarry store import" in result.stderr
    assert "Traceback" not in result.stderr

    # Range and metarange files: a store restamped by hand (or imported without the
    # rebuild) still cannot read them in this build's format — a clear FAILED_PRECONDITION, not
    # INTERNAL and not identities read with the wrong rule.
    restamped = tmp_path / "restamped.db"
    shutil.copy(v1["db"], restamped)
    store = SQLiteStore(restamped)
    store.set(format_version.PARTITION, format_version.KEY, str(FORMAT_VERSION).encode())
    store.close()
    with quarry_up(tmp_path / "home", restamped) as env:
        for args in (
            ("ls", "demo", "v1", "-r"),
            ("stat", "demo", "main@", "data/00003.parquet"),
            ("diff", "demo", "v1", "main"),
            ("commit", "demo", "main", "-m", "x"),
        ):
            result = cli(env, *args)
            assert result.returncode == 1, (args, result.stdout)
            assert result.stderr.startswith("quarry: FORMAT_VERSION_MISMATCH: "), result.stderr
            assert "storage format version 1" in result.stderr
            assert "quarry store export" in result.stderr and "quarry store import" in result.stderr
        with client_for(env) as client:
            # The failed commit changed nothing a user sees.
            assert [c.id for c in client.iter_log("demo", "main")] == v1["snapshot"]["demo"][
                "log main"
            ]


def test_export_import_rebuilds_and_reads_back_every_entry(v1, tmp_path):
    before = {f: os.stat(f).st_mtime_ns for f in glob.glob(f"{v1['lake']}/*/_quarry/*/*")}
    dump, target = tmp_path / "dump.jsonl", tmp_path / "v2.db"
    result = quarry(
        tmp_path / "home", "store", "export", str(dump), "--kv-url", f"sqlite:///{v1['db']}"
    )
    assert result.returncode == 0, result.stderr
    assert "storage format 1" in result.stderr
    result = quarry(
        tmp_path / "home", "store", "import", str(dump), "--kv-url", f"sqlite:///{target}"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "imported 3 repositories" in result.stderr and f"stamped {FORMAT_VERSION}" in result.stderr
    )

    # Each distinct format-1 range referenced is rewritten exactly once.
    referenced = {
        repo: range_ids_in(
            f"{v1['lake']}/{repo}/_quarry/metaranges/{m}.parquet"
            for m in ids
            if os.path.exists(f"{v1['lake']}/{repo}/_quarry/metaranges/{m}.parquet")
        )
        for repo, ids in v1["metaranges"].items()
    }
    rewritten = sum(len(ids) for ids in referenced.values())
    assert f"in storage format {FORMAT_VERSION}: {rewritten} ranges," in result.stderr, (
        result.stderr
    )
    # The merge hint named a format-1 metarange id: dropped, not translated.
    assert "; 1 merge hints dropped" in result.stderr
    store = SQLiteStore(target)
    try:
        assert [
            item.key
            for partition in _repo_partitions(store)
            for item in store.scan(partition)
            if item.key.startswith(b"mergehints/")
        ] == []
        # Format 1 wrote no ownership markers: the rebuild gives every namespace the marker
        # of its repository, instance and this installation (GC refuses a namespace without).
        installation = store.get(b"quarry", b"installation-id").value.decode()
        for item in store.scan(b"quarry", REPOS_PREFIX, REPOS_PREFIX[:-1] + b"0"):
            repo = Repository.from_record(item.value, item.key)
            marker = parse_marker(Path(repo.storage_namespace, MARKER_KEY).read_bytes())
            assert (marker.repository, marker.instance_id, marker.installation_id) == (
                repo.name,
                repo.instance_id,
                installation,
            )
    finally:
        store.close()

    with quarry_up(tmp_path / "home", target) as env, client_for(env) as client:
        # Every field of every entry, on branches (staging included), tags and every
        # commit of the log; the uncommitted changes; the compacted branch; commit ids.
        after = json.loads(json.dumps(format_v1.snapshot(client)))
        assert after == v1["snapshot"]
        assert after["demo"]["branches"]["compacted"][3]  # still compacted
        assert after["demo"]["uncommitted compacted"] and after["demo"]["uncommitted main"]

        # Range and metarange ids are recomputed; nothing refers to a format-1 file.
        new_ids = format_v1.metarange_ids(client)
        for repo, ids in new_ids.items():
            assert not set(ids) & set(v1["metaranges"][repo])
            lake = f"{v1['lake']}/{repo}/_quarry"
            files = [
                f"{lake}/metaranges/{m}.parquet"
                for m in ids
                if os.path.exists(f"{lake}/metaranges/{m}.parquet")
            ]
            # Flat, or an index root over pages (format 3), in this build's format.
            assert {tags_of(f)[Path(f).stem] for f in files} <= {
                b"metarange/v%d" % FORMAT_VERSION,
                b"metarange-index/v%d" % FORMAT_VERSION,
            }
            namespace = LocalBlobStore(f"{v1['lake']}/{repo}")
            used = {r.id for m in ids for r in read_metarange(namespace, m)}
            assert not used & referenced[repo]
            assert {tags_of(f"{lake}/ranges/{r}.parquet")[r] for r in used} <= {
                b"range/v%d" % FORMAT_VERSION
            }

        # The rebuilt store is live, with the new identity rule. Committed identities were
        # recomputed: re-staging committed entries exactly as read is no change...
        client.create_branch("demo", "same", "v1")
        unchanged = list(client.iter_objects("demo", "v1", prefix="data/0001"))
        client.put_objects("demo", "same", unchanged)
        assert list(client.iter_uncommitted("demo", "same")) == []
        # ...a re-pointed address is committed, and the compacted branch commits what it
        # holds.
        staged = client.stat_object("demo", "compacted", "data/00150.parquet")
        client.put_object(
            "demo",
            "main",
            path="data/00020.parquet",
            physical_address="s3://lake/moved.parquet",
            size_bytes=client.stat_object("demo", "main", "data/00020.parquet").size_bytes,
        )
        client.commit("demo", "main", "after the rebuild")
        assert (
            client.stat_object("demo", "main@", "data/00020.parquet").physical_address
            == "s3://lake/moved.parquet"
        )
        client.commit("demo", "compacted", "compacted after the rebuild")
        assert format_v1.entry_fields(
            client.stat_object("demo", "compacted@", "data/00150.parquet")
        ) == format_v1.entry_fields(staged)

    # The format-1 files are all still there, untouched (the old build can still use its
    # store); the new ones sit next to them, and GC may collect the old ones.
    assert {f: os.stat(f).st_mtime_ns for f in before} == before
