"""SQLite KV store: the embedded default. Safe for many threads and several processes on
one database file.

- WAL journal: readers never block the writer and see a consistent snapshot per statement.
- Every conditional write is ONE statement (INSERT .. ON CONFLICT DO NOTHING, or UPDATE ..
  WHERE value = ?) checked through changes(): SQLite runs each write statement under the
  database write lock, so compare-and-swap is atomic across threads and processes without
  a read-then-write transaction.
- Batch writes run in one BEGIN IMMEDIATE transaction (take the write lock up front, so two
  writers wait on busy_timeout instead of failing on a lock upgrade).
- Keys and values are BLOBs; SQLite compares BLOBs with memcmp, i.e. unsigned byte order,
  which is exactly the KV contract's key order.
- Writers of one process queue on a Python lock. SQLite's busy handler polls with sleeps
  growing to 100 ms, so threads contending inside SQLite starved for up to ~1 s (measured,
  16 writer threads); the lock hands over immediately. busy_timeout is then only used
  between processes. Readers take no lock (WAL).
- Connections come from a small pool rather than one per thread, so short-lived threads do
  not leak connections.
- The database holds every credential hash and all metadata, so only its owner may read
  it: the file is created 0600 before SQLite opens it (SQLite gives its -wal and -shm the
  database file's mode), a directory the store creates is 0700, and at start a database,
  -wal or -shm file that group or others can access (made by an older version) is
  tightened to 0600 with a warning; one that cannot be tightened (not ours) is refused.
  An existing directory keeps its mode: it may be shared (`quarry up` creates QUARRY_HOME
  0700); with the files 0600 others can at most see their names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence

from quarry import errors
from quarry.kv import store
from quarry.kv.store import GetResult, KeyValue

log = logging.getLogger(__name__)

# Owner only: the database (and its -wal and -shm) holds credential hashes.
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_COMPANIONS = ("", "-wal", "-shm")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    partition BLOB NOT NULL,
    key       BLOB NOT NULL,
    value     BLOB NOT NULL,
    PRIMARY KEY (partition, key)
) WITHOUT ROWID
"""


def _private_database_file(path: str) -> None:
    """The database file exists, owner-only (module docstring), before SQLite opens it."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=DIRECTORY_MODE, exist_ok=True)
    # An empty file is an empty database; O_EXCL keeps one another process just made.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    for suffix in _COMPANIONS:
        name = path + suffix
        try:
            mode = stat.S_IMODE(os.stat(name).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            try:
                os.chmod(name, FILE_MODE)
            except OSError as exc:
                raise store.BackendUnavailable(
                    f"{name} is readable by other users (mode {mode:o}) and cannot be made "
                    f"owner-only: {exc.strerror}; chmod 600 it as its owner"
                ) from exc
            log.warning(
                "tightened %s from mode %o to %o: it holds credential hashes", name, mode, FILE_MODE
            )


class DatabaseFileGone(errors.DataLoss):
    """The database file was deleted or replaced under the running store."""

    reason = "KV_FILE_GONE"


class DatabaseCorrupt(errors.DataLoss):
    """SQLite found the database file damaged ("malformed", "not a database")."""

    reason = "KV_STORE_CORRUPT"


# Reads look at the file's identity at most this often (writes every time).
_READ_CHECK_SECONDS = 1.0


class SQLiteStore(store.PagedStore):
    """`path` is a database file (created with its parent directory if missing).

    `synchronous`: FULL (default) makes every acknowledged write survive power loss;
    NORMAL is faster and in WAL mode still survives a crash of the process.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "FULL",
        max_idle_connections: int = 8,
    ):
        self.path = os.fspath(path)
        if self.path in ("", ":memory:") or self.path.startswith("file:"):
            # Each connection would get its own private database; use MemoryStore instead.
            raise errors.InvalidArgument(
                "SQLiteStore needs a file path (use memory:// for an in-memory store)"
            )
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise errors.InvalidArgument(f"bad synchronous mode {synchronous!r}")
        _private_database_file(self.path)
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous.upper()
        self._max_idle = max_idle_connections
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        self._identity: tuple[int, int] | None = None  # set once the file exists (below)
        with self._connection() as conn:
            # WAL is a property of the file: set once, every later connection inherits it.
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise store.BackendUnavailable(
                    f"could not enable WAL on {self.path} (journal_mode is {mode})"
                )
            conn.execute(_SCHEMA)
        # Safety rule: never acknowledge a write into a file that is no longer the store.
        # Open connections keep writing to a deleted (unlinked) file, and all of it is gone
        # at the next start: so the file's identity is checked before every write, and
        # every _READ_CHECK_SECONDS by reads (the health probe's among them).
        self._identity = self._file_identity()
        self._checked_at = time.monotonic()

    # ---- connections ----

    def _file_identity(self) -> tuple[int, int]:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            raise DatabaseFileGone(
                f"the KV database file {self.path} was deleted while in use: writes since "
                "then would be lost. Restore it from a backup and restart",
                metadata={"path": self.path},
            ) from None
        return info.st_dev, info.st_ino

    def _check_file(self, every: float) -> None:
        now = time.monotonic()
        if now - self._checked_at < every:
            return
        if self._file_identity() != self._identity:
            raise DatabaseFileGone(
                f"the KV database file {self.path} was replaced while in use: this store "
                "still holds the old one open. Restart to use the new one",
                metadata={"path": self.path},
            )
        self._checked_at = now

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: autocommit; transactions are explicit BEGIN/COMMIT.
        # check_same_thread=False: pooled connections move between threads (never shared
        # by two at once) and close() may run on any thread.
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    @contextlib.contextmanager
    def _connection(self, check_every: float = _READ_CHECK_SECONDS) -> Iterator[sqlite3.Connection]:
        if self._identity is not None:
            self._check_file(check_every)
        with self._lock:
            if self._closed:
                raise store.BackendUnavailable("SQLite store is closed")
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = self._open()
            yield conn
        except sqlite3.Error as e:
            raise _translate(e) from e
        finally:
            if conn is not None:
                self._release(conn)

    def _release(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            # Only reached when a statement failed mid-transaction.
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    @contextlib.contextmanager
    def _writer(self) -> Iterator[sqlite3.Connection]:
        """A connection for one write statement (autocommit), one writer thread at a time."""
        with self._write_lock, self._connection(check_every=0.0) as conn:
            yield conn

    @contextlib.contextmanager
    def _write_transaction(self) -> Iterator[sqlite3.Connection]:
        with self._writer() as conn:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ---- operations ----

    def get(self, partition: bytes, key: bytes) -> GetResult:
        store.check_key(partition, key)
        with self._connection() as conn:
            row = conn.execute(
                "SELECT value FROM kv WHERE partition = ? AND key = ?", (partition, key)
            ).fetchone()
        if row is None:
            raise store.KeyNotFound("key not found")
        return GetResult(value=row[0], predicate=row[0])

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        store.check_item(partition, key, value)
        with self._writer() as conn:
            conn.execute(_UPSERT, (partition, key, value))

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        store.check_item(partition, key, value)
        store.check_predicate(predicate)
        if predicate is store.ABSENT:
            sql = (
                "INSERT INTO kv (partition, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (partition, key) DO NOTHING"
            )
            args: tuple = (partition, key, value)
        elif predicate is store.EXISTS:
            sql = "UPDATE kv SET value = ? WHERE partition = ? AND key = ?"
            args = (value, partition, key)
        else:
            assert isinstance(predicate, store.Equals)  # check_predicate allows nothing else
            sql = "UPDATE kv SET value = ? WHERE partition = ? AND key = ? AND value = ?"
            args = (value, partition, key, predicate.value)
        with self._writer() as conn:
            changed = conn.execute(sql, args).rowcount
        if changed != 1:
            raise store.PredicateFailed(f"predicate {predicate!r} failed")

    def delete(self, partition: bytes, key: bytes) -> None:
        store.check_key(partition, key)
        with self._writer() as conn:
            conn.execute("DELETE FROM kv WHERE partition = ? AND key = ?", (partition, key))

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        store.check_key(partition, key)
        store.check_delete_predicate(predicate)
        with self._writer() as conn:
            changed = conn.execute(
                "DELETE FROM kv WHERE partition = ? AND key = ? AND value = ?",
                (partition, key, predicate.value),
            ).rowcount
        if changed != 1:
            raise store.PredicateFailed(f"predicate {predicate!r} failed")

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[GetResult | None]:
        store.check_batch_keys(items)
        results: list[GetResult | None] = []
        if not items:
            return results
        with self._connection() as conn:
            # One read transaction: the whole batch sees one snapshot.
            conn.execute("BEGIN")
            for partition, key in items:
                row = conn.execute(
                    "SELECT value FROM kv WHERE partition = ? AND key = ?", (partition, key)
                ).fetchone()
                results.append(None if row is None else GetResult(row[0], row[0]))
            conn.execute("COMMIT")
        return results

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        store.check_batch_items(items)
        if items:
            with self._write_transaction() as conn:
                conn.executemany(_UPSERT, items)

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        store.check_batch_keys(items)
        if items:
            with self._write_transaction() as conn:
                conn.executemany("DELETE FROM kv WHERE partition = ? AND key = ?", items)

    def _page(
        self, partition: bytes, lower: bytes, after: bytes | None, end: bytes | None, limit: int
    ) -> tuple[list[KeyValue], bytes | None]:
        sql = "SELECT key, value FROM kv WHERE partition = ? AND key >= ?"
        args: list = [partition, lower]
        if after is not None:
            sql += " AND key > ?"
            args.append(after)
        if end is not None:
            sql += " AND key < ?"
            args.append(end)
        sql += " ORDER BY key LIMIT ?"
        args.append(limit)
        with self._connection() as conn:
            page = [KeyValue(k, v) for k, v in conn.execute(sql, args)]
        # A full page may have more behind it; the next page resumes after its last key.
        return page, (page[-1].key if len(page) == limit else None)


_UPSERT = (
    "INSERT INTO kv (partition, key, value) VALUES (?, ?, ?) "
    "ON CONFLICT (partition, key) DO UPDATE SET value = excluded.value"
)


def _translate(e: sqlite3.Error) -> errors.QuarryError:
    # "database is locked" after busy_timeout, I/O errors, a vanished file: all transient
    # or operational from the caller's point of view, so retryable UNAVAILABLE.
    if isinstance(e, sqlite3.DatabaseError) and any(
        sign in str(e) for sign in ("malformed", "not a database")
    ):
        return DatabaseCorrupt(
            f"SQLite: {e}: the KV database file is damaged; restore it from a backup "
            "(`quarry doctor` names the records it can still read)"
        )
    if isinstance(e, sqlite3.OperationalError):
        return store.BackendUnavailable(f"SQLite: {e}")
    return errors.Internal(f"SQLite: {e}")
