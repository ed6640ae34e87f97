"""`quarry ARGS` run in the test's own process, as a child process would see it.

A `quarry` child process costs about half a CPU-second before it does anything (importing
grpc, protobuf and the client); the CLI modules run hundreds of commands. `run_quarry`
calls the CLI's own entry point (quarry.cli.main.main) instead, with what a child would
have: exactly `env` as its environment, `stdin` as its input (not a terminal), stdout and
stderr as pipes (not terminals: no colour), `cwd` as its working directory, the exit code
argparse's SystemExit or main's return value, and bare gRPC channels (the test session's
admin token, support.auth.install_client_tokens, is not lent to it: it logs in with the
credentials in `env`, or fails as a child would). The commands still reach the services
over gRPC on loopback. (While a command runs, servers running in this process see its
environment too: they read their settings when they start, so it changes nothing there.)

What only a real process shows stays on real processes: `quarry up` and `serve`, signals,
terminals, --trace (the tracer is process-global), commands that start a Spark JVM
(`child=True`), and the console script itself (tests/e2e/test_cli.py's `quarry version`,
bash completion, the README runner)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from support.auth import without_client_tokens
from support.processes import VENV_BIN


class _Pipe(io.TextIOWrapper):
    """A text stream over bytes, as a child's redirected stdout/stderr (not a terminal)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)

    def data(self) -> bytes:
        self.flush()
        return self.buffer.getvalue()  # type: ignore[attr-defined]


@contextlib.contextmanager
def _as_a_child(env: dict[str, str], cwd: Path | None) -> Iterator[None]:
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with without_client_tokens():
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def run_quarry(
    args: Sequence[str],
    env: dict[str, str],
    *,
    stdin: str | bytes = "",
    cwd: Path | None = None,
    text: bool = True,
    child: bool = False,
) -> subprocess.CompletedProcess:
    """`quarry ARGS` in process; a CompletedProcess as subprocess.run(capture_output=True)
    would give (str or bytes as `text` says). `child=True` runs the console script in a
    child process instead, for a command whose behaviour is the process's own (e.g. one that
    starts a Spark JVM: in process it would find the worker's Spark session running)."""
    given = stdin.encode() if isinstance(stdin, str) else stdin
    if child:
        done = subprocess.run(
            [str(VENV_BIN / "quarry"), *args],
            env=env,
            input=given,
            capture_output=True,
            cwd=cwd,
            timeout=120,
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        code, stdout, stderr = _in_process(list(args), env, given, cwd)
    if text:
        return subprocess.CompletedProcess(
            ["quarry", *args],
            code,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
        )
    return subprocess.CompletedProcess(["quarry", *args], code, stdout, stderr)


def _in_process(args: list[str], env: dict[str, str], stdin: bytes, cwd: Path | None):
    from quarry.cli.main import main

    out, err = _Pipe(), _Pipe()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr, sys.argv)
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin.decode()), out, err
    sys.argv = ["quarry", *args]
    try:
        with _as_a_child(env, cwd):
            try:
                code = main(args)
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.stdin, sys.stdout, sys.stderr, sys.argv = saved_streams
    return code, out.data(), err.data()
