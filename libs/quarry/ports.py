"""Race-free ports for servers started on a fixed port by the tests (child processes given a
`QUARRY_*_PORT`, dynalite, moto_server) and by `deploy/local/kube.py --free-ports` (the
chart's services under podman).

The old way - bind port 0, read the port, close the socket - raced twice over: the kernel may
hand the same port to the next bind(0) (so `{name: free_port() for name in SERVICES}` once
gave compactor-sensor branch-manager's port) or to any client socket before the server binds
it (a chart's console, started seconds later, once found its port taken), and a port handed
out in one process (an xdist worker, another checkout's run) is unknown to every other.

Here a port is handed out at most once per process, and at most once across processes while
the process that took it lives: each port is a byte of one lock file (a POSIX record lock,
held until the process exits, dropped by the kernel if it dies). The ports come from below
the kernel's ephemeral range (ip_local_port_range), so no bind(0) - the in-process servers,
every client socket - can take one meanwhile; a port something else listens on is skipped."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

# Below Linux's default ephemeral range (32768-60999) and above the well-known services and
# Quarry's own default ports (7401-7409).
LOW, HIGH = 20000, 32767
LOCK_FILE = Path(tempfile.gettempdir()) / "quarry-ports.lock"

_lock = threading.Lock()
_pid = 0  # the process the state below belongs to (a forked child starts afresh)
_fd = -1  # the lock file, open for the life of the process
_taken: set[int] = set()  # tried by this process (its own record locks never conflict)


def _range() -> tuple[int, int]:
    """LOW..HIGH, cut below the kernel's ephemeral range if this machine's starts lower."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = HIGH + 1
    return LOW, min(HIGH, first - 1)


def _reserve(port: int) -> bool:
    """Take `port` for this process: its byte of the lock file, then a bind that proves
    nothing listens there now."""
    _taken.add(port)
    try:
        fcntl.lockf(_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EAGAIN):
            return False  # another process holds it
        raise
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False  # in use (or in TIME_WAIT) outside this scheme: keep the lock, skip
    return True


def _take(count: int) -> int:
    """The first of `count` consecutive ports, each reserved as free_port reserves one,
    from a random place in the range (not the next port: code that adds to a port, a
    metrics base + a service index, must not land on the port just handed out)."""
    global _pid, _fd
    low, high = _range()
    starts = list(range(low, high - count + 2))
    random.shuffle(starts)
    with _lock:
        if _pid != os.getpid():
            # First call, or a forked child (it inherits no record locks): start afresh.
            # Never close the descriptor: closing any descriptor of the file would drop
            # every record lock this process holds on it.
            _pid, _fd = os.getpid(), os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
            _taken.clear()
        for start in starts:
            block = range(start, start + count)
            if any(port in _taken for port in block):
                continue
            if all(_reserve(port) for port in block):  # stops at the first refusal
                return start
    raise RuntimeError(f"no {count} free consecutive ports left in {low}-{high}")


def free_port() -> int:
    """A port no other caller of free_port (in this or another process) gets while this
    process lives, with nothing listening on it now."""
    return _take(1)


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports (free_port's promise for each): for a
    base port that a server adds its index to (QUARRY_METRICS_BASE_PORT)."""
    return _take(count)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports from free_port."""
    return [free_port() for _ in range(count)]
