"""LocalBlobStore: a storage namespace that is a directory on the local filesystem."""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from quarry.blob.base import (
    BlobBytes,
    BlobStore,
    HashingReader,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectReader,
    Readable,
    StorageUnreachable,
    Written,
    check_key,
    check_range,
)
from quarry.blob.layout import TEMP_FILE_PREFIX

# Temporary files live next to their target (same filesystem, so os.replace/os.link are
# atomic) and are never listed (only as leftovers, list_leftovers).
TEMP_PREFIX = TEMP_FILE_PREFIX


class LocalBlobStore(BlobStore):
    def __init__(self, root: str | os.PathLike, *, durable: bool = True):
        self.root = os.path.abspath(os.fspath(root))
        # fsync files (and their directory) before they become visible: a metarange must
        # never outlive, across a crash, a range file it points to.
        self.durable = durable
        # put_deferred files (written here or found already there) and their directories,
        # not yet known to be durable: sync() makes them so.
        self._unsynced_files: set[str] = set()
        self._unsynced_dirs: set[str] = set()
        self._unsynced_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        with self._environment():
            os.makedirs(self.root, exist_ok=True)

    @contextlib.contextmanager
    def _environment(self) -> Iterator[None]:
        """The one place where the filesystem's refusals (permission denied, a file where a
        directory is expected, a read-only or full disk, a path that cannot be created such
        as /proc/x) become STORAGE_UNREACHABLE instead of an INTERNAL error."""
        try:
            yield
        except OSError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: OSError) -> StorageUnreachable:
        cause = _CAUSES.get(exc.errno or 0, exc.strerror or type(exc).__name__)
        return StorageUnreachable(
            f"storage namespace {self.root} is not usable: {cause} ({exc.filename or self.root})",
            cause=cause,
            location=self.root,
        )

    def __repr__(self) -> str:
        return f"LocalBlobStore({self.root!r})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    @property
    def is_local(self) -> bool:
        return True

    def local_path(self, key: str) -> str | None:
        return self._path(key)

    def get(self, key: str) -> bytes:
        with self.open_read(key) as reader:
            return reader.read()

    def open_read(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        check_range(offset, length)
        path = self._path(key)
        try:
            fh = open(path, "rb")  # noqa: SIM115 — the reader closes it
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"object {key!r} not found in {self.root}") from None
        except OSError as exc:
            raise self._unreachable(exc) from exc
        if offset:
            try:
                fh.seek(offset)  # past the end: reads return b""
            except OSError as exc:
                fh.close()
                raise self._unreachable(exc) from exc
        return ObjectReader(fh, self._unreachable, limit=length)

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def _write_temp(
        self, directory: str, chunks: Iterable[BlobBytes], sync_file: bool = True
    ) -> str:
        """The chunks (a put's bytes, or a put_stream's source piece by piece) in a new
        temporary file, fsynced unless told not to; a failure (also the source's) removes it."""
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            if self.durable and sync_file:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink(temp)
            raise
        os.close(fd)
        return temp

    def _sync_dir(self, directory: str) -> None:
        if not self.durable:
            return
        with contextlib.suppress(OSError):
            fsync_directory(directory)

    def put_deferred(self, key: str, data: BlobBytes) -> bool:
        # Neither the bytes nor the directory entry are fsynced here: sync() does all of a
        # batch at once, in parallel (the filesystem groups them into few journal commits).
        # A file found already there is synced too: its writer may not have synced it yet.
        path = self._path(key)
        with self._environment():
            written = self._put(key, (data,), if_absent=True, sync_directory=False, sync_file=False)
        # Recorded once the file is in place (written now, or found there).
        with self._unsynced_lock:
            self._unsynced_files.add(path)
            self._unsynced_dirs.add(os.path.dirname(path))
        return written

    def sync(self) -> None:
        self._sync_pending()

    def _sync_pending(self, also: str = "") -> None:
        """fsync every put_deferred file so far and their directories, and the file `also`
        (a temporary file not yet visible), all at once: the filesystem groups concurrent
        fsyncs into one journal commit, where one after another each waits for its own."""
        # One sync at a time: a caller must not return while another thread is still
        # syncing files this caller wrote (it took them from the shared set).
        with self._sync_lock:
            with self._unsynced_lock:
                files, self._unsynced_files = self._unsynced_files, set()
                directories, self._unsynced_dirs = self._unsynced_dirs, set()
            if not self.durable:
                return
            paths = sorted(files)
            if also:
                paths.append(also)
            # _fsync_file looked up at call time (tests replace it).
            tasks: list[Callable[[], None]] = [
                functools.partial(_fsync_file, path) for path in paths
            ]
            tasks += [functools.partial(self._sync_dir, d) for d in sorted(directories)]
            _run_all(tasks)

    def put_after_sync(self, key: str, data: BlobBytes) -> bool:
        # The object's bytes go to a temporary file (invisible) and are fsynced together
        # with the pending files and directories; only then is it linked in place and its
        # directory fsynced: two rounds of fsyncs instead of four one after another. It
        # must never be linked before _sync_pending has returned.
        with self._environment():
            written = self._put(
                key,
                (data,),
                if_absent=True,
                sync_directory=True,
                sync_file=False,
                before_link=lambda temp: self._sync_pending(also=temp),
            )
        if not written:
            self.sync()  # it was there already: the pending files still become durable
        return written

    def put(self, key: str, data: BlobBytes, if_absent: bool = False) -> bool:
        with self._environment():
            return self._put(key, (data,), if_absent, sync_directory=True)

    def put_stream(self, key: str, source: Readable) -> Written:
        # The same path as put(if_absent=True): a temporary file, fsynced, then linked under
        # its name and the directory fsynced; it never replaces an object already there.
        reader = HashingReader(source)
        try:
            with self._environment():
                if not self._put(key, reader.chunks(), if_absent=True, sync_directory=True):
                    raise ObjectExists(f"object {key!r} already exists in {self.root}")
        except StorageUnreachable:
            if reader.failure is not None:
                raise reader.failure from None  # the source's OSError, not the namespace's
            raise
        return reader.written

    def put_if_equals(self, key: str, data: bytes, expected: bytes) -> bool:
        # Replacers of one key serialize on an exclusive lock of its directory (flock works
        # on directory descriptors); a put(if_absent) cannot slip in while the object exists.
        path = self._path(key)
        directory = os.path.dirname(path)
        with self._environment():
            fd = os.open(directory, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    with open(path, "rb") as fh:
                        if fh.read() != expected:
                            return False
                except (FileNotFoundError, NotADirectoryError):
                    return False
                self._put(key, (data,), if_absent=False, sync_directory=True)
                return True
            finally:
                os.close(fd)  # releases the lock

    def first_keys(self, limit: int) -> builtins.list[str]:
        # Symbolic links to directories are not walked (nor listed, nor ever deleted), but
        # they are something: a namespace holding one is not empty.
        keys: builtins.list[str] = []
        with self._environment():
            for dirpath, dirnames, filenames in os.walk(self.root, onerror=_unless_gone):
                dirnames.sort()
                rel_dir = os.path.relpath(dirpath, self.root)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
                for name in sorted(filenames + links):
                    if not name.startswith(TEMP_PREFIX):
                        if len(keys) >= limit:
                            return keys
                        keys.append(rel_dir + name)
        return keys

    def _put(  # the put variants' switches
        self,
        key: str,
        chunks: Iterable[BlobBytes],
        if_absent: bool,
        sync_directory: bool,
        sync_file: bool = True,
        before_link: Callable[[str], None] | None = None,
    ) -> bool:
        """`before_link(temp)`: called with the written temporary file before it takes its
        name (a failure leaves nothing visible)."""
        path = self._path(key)
        directory = os.path.dirname(path)
        if if_absent and os.path.exists(path):
            return False  # cheap early exit; the link below is the real check
        temp = self._write_temp(directory, chunks, sync_file)
        try:
            if before_link is not None:
                before_link(temp)
            if not if_absent:
                os.replace(temp, path)
                temp = ""
            else:
                try:
                    os.link(temp, path)  # atomic, fails if the target exists
                except FileExistsError:
                    return False
                except OSError as exc:
                    if exc.errno not in (
                        errno.EPERM,
                        errno.ENOTSUP,
                        errno.EOPNOTSUPP,
                        errno.EXDEV,
                        errno.EMLINK,
                    ):
                        raise
                    # No hard links here: claim the name exclusively, then swap the
                    # content in (the name is briefly an empty file).
                    try:
                        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    except FileExistsError:
                        return False
                    os.replace(temp, path)
                    temp = ""
            if sync_directory:
                self._sync_dir(directory)
            return True
        finally:
            if temp:
                _unlink(temp)

    def delete(self, key: str) -> None:
        with self._environment():
            _unlink(self._path(key))

    def remove_empty_folder(self, prefix: str) -> None:
        # rmdir refuses a directory that holds anything: safe against a racing put.
        with contextlib.suppress(OSError):
            os.rmdir(self._path(prefix.rstrip("/")))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only the deepest directory the prefix fully names.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *base.split("/")) if base else self.root
        found: builtins.list[ObjectInfo] = []
        with self._environment():
            self._walk(start, prefix, found)
        found.sort()
        return iter(found)

    def list_leftovers(self, older_than: float) -> Iterator[ObjectInfo]:
        found: builtins.list[ObjectInfo] = []
        with self._environment():
            for dirpath, _dirnames, filenames in os.walk(self.root, onerror=_unless_gone):
                rel_dir = os.path.relpath(dirpath, self.root)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                for name in filenames:
                    if not name.startswith(TEMP_PREFIX):
                        continue
                    try:
                        stat = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue  # its writer finished meanwhile
                    if stat.st_mtime < older_than:
                        found.append(ObjectInfo(rel_dir + name, stat.st_size, stat.st_mtime))
        found.sort()
        return iter(found)

    def _walk(self, start: str, prefix: str, found: builtins.list[ObjectInfo]) -> None:
        for dirpath, dirnames, filenames in os.walk(start, onerror=_unless_gone):
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            dirnames[:] = [
                d
                for d in dirnames
                if (rel_dir + d + "/").startswith(prefix) or prefix.startswith(rel_dir + d + "/")
            ]
            for name in filenames:
                if name.startswith(TEMP_PREFIX):
                    continue
                key = rel_dir + name
                if key.startswith(prefix):
                    try:
                        stat = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue
                    found.append(ObjectInfo(key, stat.st_size, stat.st_mtime))


_CAUSES = {
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a file is where a directory is expected",
    errno.EEXIST: "a file is where a directory is expected",
    errno.EISDIR: "a directory is where a file is expected",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENOENT: "the directory cannot be created",
    errno.ENAMETOOLONG: "file name too long",
}


def _unless_gone(exc: OSError) -> None:
    """os.walk's error handler: an unreadable directory inside the namespace is an error,
    not an empty one (GC and the emptiness check must not mistake it for "nothing there");
    a directory that is missing, gone meanwhile or not a directory holds nothing."""
    if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        raise exc


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(path)


def fsync_directory(directory: str) -> None:
    """fsync a directory (its entries become durable); a missing one has nothing to sync.
    Other errors raise."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# fsyncs of one sync run at once, on threads shared by every store (each task is a single
# fsync that starts nothing else, so sharing cannot deadlock); a process forked from one
# that has them starts its own.
_SYNC_THREADS = 16
_sync_pool: ThreadPoolExecutor | None = None
_sync_pool_lock = threading.Lock()


def _shared_sync_pool() -> ThreadPoolExecutor:
    global _sync_pool
    with _sync_pool_lock:
        if _sync_pool is None:
            _sync_pool = ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="blob-sync")
        return _sync_pool


def _forget_sync_pool() -> None:
    global _sync_pool, _sync_pool_lock
    _sync_pool = None  # its threads did not survive the fork
    _sync_pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_sync_pool)


def _run_all(tasks: Sequence[Callable[[], None]]) -> None:
    """Run the tasks at once (the calling thread takes the first); return once every one
    has finished, raising the first failure."""
    if not tasks:
        return
    futures = [] if len(tasks) == 1 else [_shared_sync_pool().submit(t) for t in tasks[1:]]
    first: BaseException | None = None
    try:
        tasks[0]()
    except BaseException as error:
        first = error
    for future in futures:
        try:
            future.result()
        except BaseException as error:
            first = first or error
    if first is not None:
        raise first
