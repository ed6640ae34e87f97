"""The `quarry` command (quarry.cli.main).

gRPC's C core logs its own lines on stderr (e.g. `E1127 ... add_port.cc:83] Failed to add
port` before our "cannot listen on ... (address in use?)"): the command and the services it
starts report every failure themselves, so the core is silenced before grpc is first
imported, unless GRPC_VERBOSITY is set (e.g. GRPC_VERBOSITY=debug to see them)."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
