"""The lifeline: a supervised service stops when its supervisor (`quarry up`) is gone.

`quarry up` opens a pipe, keeps the write end to itself and hands every service the read
end (its number in QUARRY_LIFELINE_FD). Nothing is ever written: a read blocks for as long
as the supervisor lives, and returns end-of-file once no process holds the write end — the
kernel closes it whenever the supervisor ends, a SIGKILL or the OOM killer included, when
none of its own code runs. The service then stops as on SIGTERM (draining in-flight calls).

Chosen over the kernel's parent-death signal (prctl PR_SET_PDEATHSIG), which fires when
the parent *thread* that started the child ends, is Linux-only, and must be set between
fork and exec. A pipe also has no race: a supervisor that died before the service started
watching is seen at once (the first read returns end-of-file).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

LIFELINE_FD_ENV = "QUARRY_LIFELINE_FD"


def watch_lifeline(on_lost: Callable[[], None], env: Mapping[str, str] | None = None) -> bool:
    """When the environment names a lifeline (a service started by `quarry up`), start a
    daemon thread that calls `on_lost` once the supervisor is gone; True if watching.
    Without one (`quarry serve` run by hand, a container) nothing is watched."""
    raw = (os.environ if env is None else env).get(LIFELINE_FD_ENV, "")
    if not raw:
        return False
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):
        # A stale variable (e.g. a service started from a shell that inherited it): no
        # supervisor handed us a pipe, so there is nothing to watch.
        log.warning("%s=%r names no open file descriptor; not watching", LIFELINE_FD_ENV, raw)
        return False

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass  # nothing is ever written; tolerate it anyway
        except OSError:
            pass  # closed under us: the supervisor is unreachable all the same
        # The supervisor is `quarry up`, or a service's worker supervisor (runtime.workers).
        log.warning("the process that started this one (its supervisor) is gone; stopping")
        on_lost()

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return True
