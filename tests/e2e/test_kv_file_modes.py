"""The embedded KV database holds every credential hash and all metadata: only its owner may
read it (issue 23, item 4). Real `quarry serve kv-gateway` processes, started as users start
them, then the modes of kv.db, kv.db-wal, kv.db-shm and their directory. (`quarry up` on a
fresh home: tests/e2e/test_cli.py's test of `quarry up` checks the same modes, and those of
the home it creates, without a `quarry up` of its own here.)

The attack was a local user reading kv.db (0644 in a 0755 directory). The database and its
WAL files must be 0600, a directory the store or `quarry up` creates 0700, and files an older
version left readable are tightened at start.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path

from quarry.kv.remote import RemoteStore
from support.processes import free_port, quarry_env, quarry_serve, wait_serving

DATABASE_FILES = ("kv.db", "kv.db-wal", "kv.db-shm")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_through_the_gateway(target: str) -> None:
    # A write, so the WAL and its shared-memory index exist and hold data.
    store = RemoteStore(target)
    try:
        store.set(b"quarry", b"file-modes-test", b"value")
    finally:
        store.close()


def test_kv_gateway_creates_its_database_owner_only(tmp_path):
    home = tmp_path / "fresh" / "home"  # nothing exists yet: the store creates it
    port = free_port()
    old_umask = os.umask(0o022)  # the usual umask, which made the files 0644 before
    try:
        env = quarry_env(home, QUARRY_KV_GATEWAY_PORT=str(port))
        with quarry_serve("kv-gateway", env) as child:
            wait_serving(f"127.0.0.1:{port}")
            _write_through_the_gateway(f"127.0.0.1:{port}")
            for name in DATABASE_FILES:
                assert mode(home / name) == 0o600, (name, oct(mode(home / name)))
            assert mode(home) == 0o700
            assert child.poll() is None
    finally:
        os.umask(old_umask)


def test_kv_gateway_tightens_a_database_an_older_version_left_readable(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    old_umask = os.umask(0o022)
    try:
        # As an older version left it: SQLite's own 0644 files, WAL mode, some data.
        with contextlib.closing(sqlite3.connect(home / "kv.db")) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
            conn.commit()
            keep_open = sqlite3.connect(home / "kv.db")  # keeps -wal and -shm on disk
            keep_open.execute("SELECT * FROM t").fetchall()
            for name in DATABASE_FILES:
                assert mode(home / name) == 0o644, name
        port = free_port()
        env = quarry_env(home, QUARRY_KV_GATEWAY_PORT=str(port))
        with quarry_serve("kv-gateway", env) as child:
            wait_serving(f"127.0.0.1:{port}")
            _write_through_the_gateway(f"127.0.0.1:{port}")
            for name in DATABASE_FILES:
                assert mode(home / name) == 0o600, (name, oct(mode(home / name)))
            child.terminate()
            _, err = child.communicate(timeout=20)
        keep_open.close()
        assert "tightened" in err and "kv.db" in err
    finally:
        os.umask(old_umask)
