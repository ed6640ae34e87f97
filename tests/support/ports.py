"""Race-free ports for servers the tests start on a fixed port (child processes given a
`QUARRY_*_PORT`, dynalite, moto_server).

The old way - bind port 0, read the port, close the socket - raced twice over: the kernel may
hand the same port to the next bind(0) (so `{name: free_port() for name in SERVICES}` once
gave compactor-sensor branch-manager's port), and a port handed out in one pytest process
(an xdist worker, another checkout's run) is unknown to every other process.

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
LOCK_FILE = Path(tempfile.gettempdir()) / "quarry-test-ports.lock"

_lock = threading.Lock()
_pid = 0  # the process the state below belongs to (a forked child starts afresh)
_fd = -1  # the lock file, open for the life of the process
_taken: set[int] = set()  # tried by this process (its own record locks never conflict)
_next = 0


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


def free_port() -> int:
    """A port no other caller of free_port (in this or another process) gets while this
    process lives, with nothing listening on it now."""
    global _pid, _fd, _next
    low, high = _range()
    span = high - low + 1
    with _lock:
        if _pid != os.getpid():
            # First call, or a forked child (it inherits no record locks): start afresh.
            # Never close the descriptor: closing any descriptor of the file would drop
            # every record lock this process holds on it.
            _pid, _fd, _next = os.getpid(), os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666), 0
            _taken.clear()
            _next = low + random.randrange(span)
        for _ in range(span):
            port, _next = _next, low + (_next - low + 1) % span
            if port not in _taken and _reserve(port):
                return port
    raise RuntimeError(f"no free port left in {low}-{high}")


def free_ports(count: int) -> list[int]:
    """`count` distinct ports from free_port."""
    return [free_port() for _ in range(count)]
