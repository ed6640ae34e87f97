"""The real grpcurl binary (`make install` puts it in the venv), as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.processes import REPO_ROOT

GRPCURL = Path(sys.executable).parent / "grpcurl"


def proto_args() -> list[str]:
    """`-import-path protos -proto quarry/v1/<each>.proto`: the contract from the proto files,
    for a server without reflection (or to check the files themselves)."""
    args = ["-import-path", str(REPO_ROOT / "protos")]
    for path in sorted((REPO_ROOT / "protos/quarry/v1").glob("*.proto")):
        args += ["-proto", f"quarry/v1/{path.name}"]
    return args


def grpcurl(
    *args: str,
    data: dict | None = None,
    token: str | None = None,
    messages: list[dict] | None = None,
) -> subprocess.CompletedProcess:
    """grpcurl ARGS; with `token`, as `grpcurl -H "authorization: Bearer <token>"` (health,
    reflection and ServerInfo need none). `messages`: a client stream, sent on stdin as
    `grpcurl -d @` reads it, one JSON message after another."""
    command = [str(GRPCURL), "-plaintext", "-format-error"]
    if token is not None:
        command += ["-H", f"authorization: Bearer {token}"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    stdin = None
    if messages is not None:
        command += ["-d", "@"]
        stdin = "\n".join(json.dumps(m) for m in messages)
    return subprocess.run(
        command + list(args), input=stdin, capture_output=True, text=True, timeout=30
    )
