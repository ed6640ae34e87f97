"""Quarry: version control for data-lake metadata."""

import os as _os

__version__ = "0.1.0"

# gRPC's fork support (on by default in grpcio 1.80+) restarts its poller in a child made by
# fork(); subprocess.Popen then closes that poller's epoll fd before exec and the child can
# die before it execs (grpc/grpc#43055). Popen takes fork() whenever it runs Python in the
# child (preexec_fn): PySpark starts its JVM that way, so `quarry gc` and every Spark write
# from a process holding a gRPC channel failed now and then with JAVA_GATEWAY_EXITED. Quarry
# never uses gRPC across fork() (services and workers are separate processes, each with its
# own channels), so the support is off unless the environment says otherwise. Set here, in
# the package every Quarry module imports first, because gRPC reads it once, when it starts.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The storage format this build reads and writes: the ONE version number of everything
# Quarry stores. Stamped in the KV store at first start (partition `quarry`, key
# `format-version`; a mismatch refuses to start), and the format tag and id header of every
# range and metarange file (quarry.committed.format; another version is refused on read).
# Bump it once for any change to what is stored; `quarry store export` + `quarry store import` rebuild
# (import converts records in exporting._Rebuilder, committed files in
# quarry.committed.legacy: add the old number to its LEGACY_VERSIONS).
#   1: entry identity without the physical address.
#   2: entry identity covers the physical address (docs/architecture.md §2); ranges,
#      metaranges and their ids rewritten by import.
#   3: two-level metaranges (an index root over pages, docs/architecture.md §5); ranges and
#      metaranges rewritten by import.
FORMAT_VERSION = 3
