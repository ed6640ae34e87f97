"""What every client subcommand shares: the Context of one run (settings, client, output
options), the `command` wrapper that turns every failure into one line and exit code 1,
the connection options, and the helpers that add a subcommand's parser.

Failures print one line, `quarry: <REASON>: <message>`, on stderr and exit with 1 (2 for a
usage error: a command line that cannot be run as given). Under
`--json` they print one JSON object on stderr instead (stdout stays empty, so it only ever
holds a success's JSON): `{"error": {"code", "reason", "message", "metadata"}}`, `code`
being the gRPC status name (NOT_FOUND, FAILED_PRECONDITION, ...).

Nothing reaches stdout before a command has succeeded: the wrapper buffers it and writes it
out once the handler returns (an error leaves stdout empty, never a header or half a list).
The one exception is output too large to hold, an object's bytes (`quarry cat`): it goes
straight to the real stdout (Context.unheld_stdout), and a failure after the first byte
leaves what was written, as with curl.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import errno
import functools
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from quarry import config, errors
from quarry.cli import output, style
from quarry.cli.progress import Progress
from quarry.client import Client, RetryPolicy
from quarry.runtime.tls import names_tls_failure
from quarry.telemetry import DEFAULT_ENDPOINT

CONNECTION_REFUSED = "connection refused"


@dataclasses.dataclass(frozen=True)
class _InteractiveRetry(RetryPolicy):
    """Retries as the library does, but not a refused connection: nothing listens there,
    and a person is waiting (the service is down, or the address is wrong)."""

    def is_retryable(self, exc: errors.QuarryError) -> bool:
        if CONNECTION_REFUSED in exc.message.lower():
            return False
        return super().is_retryable(exc)


# Interactive use: give up on an unreachable or contended service within seconds.
CLI_RETRY: RetryPolicy = _InteractiveRetry(budget=5.0)
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Subparsers = argparse._SubParsersAction
# Adds one top-level command's parser: (the `quarry` subparsers, the common options).
Registration = Callable[[Subparsers, argparse.ArgumentParser], None]


class CliError(Exception):
    """A failure detected by the CLI itself (not by a service); `code` is the gRPC status
    name it would have had (shown under --json)."""

    def __init__(self, reason: str, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = code


class UsageError(CliError):
    """A command line that cannot be run as given (options that exclude each other, a
    required choice not made): exit code 2, as argparse's own usage errors."""

    def __init__(self, message: str) -> None:
        super().__init__("USAGE", message, "INVALID_ARGUMENT")


class Context:
    """Settings, the client and output options of one command run (built lazily)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json = bool(getattr(args, "json", False))
        self._settings: Any = None
        self._client: Client | None = None
        # The real stdout: the Context is built before the wrapper holds stdout.
        self._stdout = sys.stdout

    @property
    def settings(self) -> Any:
        if self._settings is None:
            from quarry.config import load_settings

            overrides = {}
            if getattr(self.args, "branch_manager", None):
                overrides["branch_manager_address"] = self.args.branch_manager
            if getattr(self.args, "committer", None):
                overrides["committer_address"] = self.args.committer
            if getattr(self.args, "compactor_sensor", None):
                overrides["compactor_sensor_address"] = self.args.compactor_sensor
            self._settings = load_settings(**overrides)
        return self._settings

    @property
    def client(self) -> Client:
        if self._client is None:
            # Listings that skipped corrupt records are shown, with a warning (warn_skipped).
            from quarry.client.token_cache import TokenCache

            # The token outlives the run ($QUARRY_HOME/tokens.json): one Login per token
            # lifetime, not one scrypt on the server per command.
            self._client = Client.from_settings(
                self.settings,
                retry=CLI_RETRY,
                timeout=self.args.timeout,
                allow_incomplete_listings=True,
                token_cache=TokenCache(self.settings.home),
            )
        return self._client

    def dialled(self) -> dict[str, str]:
        """The services this run's client dialled, by name (for errors that name one)."""
        client = self._client
        dialled = {}
        if client is not None:
            dialled = {
                "branch-manager": client.branch_manager_target,
                "committer": client.committer_target,
                "compactor-sensor": client.compactor_sensor_target,
            }
        if hasattr(self.args, "kv_gateway"):  # doctor reads the KV store through it
            dialled["kv-gateway"] = self.args.kv_gateway or self.settings.kv_gateway_address
        return dialled

    def unheld_stdout(self) -> Any:
        """The real stdout as a binary stream (write, flush), past the hold: for output too
        large to hold (an object's bytes). What it gets stays written even if the command
        fails later."""
        self._stdout.flush()
        binary = getattr(self._stdout, "buffer", None)
        return _BinarySink(binary) if binary is not None else _TextSink(self._stdout)

    def progress(self, label: str, total: int | None = None, unit: str = "") -> Progress:
        forced = bool(getattr(self.args, "progress", False))
        return Progress(label, total, unit=unit, enabled=True if forced else None)

    def warn_skipped(self) -> None:
        """Say so on stderr when a listing left out corrupt records."""
        skipped = self._client.skipped_corrupt_records if self._client is not None else 0
        if skipped:
            print(
                f"quarry: warning: the server skipped {skipped} corrupt record(s) in this "
                f"listing (CORRUPT_RECORD); run `quarry doctor` to find them",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class _BinarySink:
    """Every byte onto a binary stream: under `python -u` (PYTHONUNBUFFERED) stdout's binary
    layer is the raw file, whose write() may take only part of a chunk."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            written = self._stream.write(view)  # None: a non-blocking stream took nothing
            view = view[written or 0 :]
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


class _TextSink:
    """Bytes onto a text-only stream (a caller's io.StringIO), decoded as _release does."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> int:
        self._stream.write(self._decoder.decode(data))
        return len(data)

    def flush(self) -> None:
        self._stream.write(self._decoder.decode(b"", final=True))
        self._stream.flush()


Handler = Callable[[argparse.Namespace, Context], int]  # the exit code


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# Request fields that errors name (the servers speak the protos' field names) and the CLI
# flag a user sets them with: error messages say the flag. The one place for the mapping.
REQUEST_FIELD_FLAGS = {
    "parent_number": "--parent",
    "page_size": "--page-size",
    "if_absent": "--if-absent",
    "allow_empty": "--allow-empty",
    "dry_run": "--dry-run",
    "default_branch": "--default-branch",
    "content_type": "--content-type",
    "default_retention_days": "--retention-days",
}
_FIELD_WORDS = re.compile(r"\b(" + "|".join(map(re.escape, REQUEST_FIELD_FLAGS)) + r")\b")


def flag_names(message: str) -> str:
    """`message` with each request field name it mentions replaced by the CLI flag."""
    return _FIELD_WORDS.sub(lambda m: REQUEST_FIELD_FLAGS[m.group(1)], message)


def fail(
    reason: str,
    message: str,
    *,
    code: str = "INVALID_ARGUMENT",
    metadata: dict[str, str] | None = None,
    as_json: bool = False,
) -> int:
    """Report a failure on stderr (one line, or one JSON object) and return exit code 1."""
    if as_json:
        error = {"code": code, "reason": reason, "message": message, "metadata": metadata or {}}
        json.dump({"error": error}, sys.stderr, sort_keys=False)
        sys.stderr.write("\n")
    else:
        prefix = style.err(f"quarry: {reason}:", "red", "bold")
        print(f"{prefix} {_one_line(message)}", file=sys.stderr)
    return EXIT_FAILURE


# Refusals that mean "this CLI has no credentials": say how to get them.
_NO_CREDENTIALS_REASONS = ("TOKEN_MISSING",)


def _with_hint(exc: errors.QuarryError) -> str:
    message = flag_names(exc.message)
    if exc.reason in _NO_CREDENTIALS_REASONS:
        from quarry.client.session import HOW_TO_GET_CREDENTIALS

        return f"{message} — {HOW_TO_GET_CREDENTIALS}"
    return message


_ERRNO_CODES = {
    errno.ENOENT: "NOT_FOUND",
    errno.EACCES: "PERMISSION_DENIED",
    errno.EPERM: "PERMISSION_DENIED",
    errno.EEXIST: "ALREADY_EXISTS",
}


# Connection failures that name a TLS mistake (quarry.runtime.tls), not a service that is down.
_TLS_REASONS = ("CONNECTION_CLOSED_AT_SETUP", "TLS_HANDSHAKE_FAILED")

_PEER = re.compile(r"ipv[46]:(\[[^\]]*\]|[^\s:]+):(\d+)")


def unreachable(exc: errors.QuarryError, services: dict[str, str]) -> CliError | None:
    """gRPC's own "failed to connect" as which service was not reached, where, and what to
    do; None for any other failure. `services`: name -> address the CLI dialled."""
    message = exc.message or ""
    if exc.code.name != "UNAVAILABLE" or "failed to connect" not in message.lower():
        return None
    if exc.reason in _TLS_REASONS or names_tls_failure(message):
        # Reached, but TLS is set up wrong -- here or between two services (a dependency
        # restarted with an expired certificate): its own text says what to fix.
        return None
    peer = _PEER.search(message)
    port = peer.group(2) if peer else ""
    named = [
        (name, address)
        for name, address in services.items()
        if address and port and address.rsplit(":", 1)[-1] == port
    ]
    why = "connection refused" if CONNECTION_REFUSED in message.lower() else "no connection"
    if peer and not named:
        # Not an address this command dialled: the service it reached could not reach one
        # of its own dependencies (a range-writer or kv-gateway down mid-commit). The
        # user's connection and flags are fine; saying "Is Quarry running?" misled.
        return CliError(
            "DEPENDENCY_UNREACHABLE",
            f"a Quarry service could not reach another one at {peer.group(0)} ({why}): it is "
            "down or restarting. Check that the service on that port runs (its log says why "
            "not), then retry",
            "UNAVAILABLE",
        )
    name, address = named[0] if len(named) == 1 else ("service", peer.group(0) if peer else "")
    flag = (
        f" --{name}"
        if name in ("branch-manager", "committer", "compactor-sensor", "kv-gateway")
        else ""
    )
    return CliError(
        "SERVICE_UNREACHABLE",
        f"cannot reach the {name} at {address} ({why}). Is Quarry running? Start it with "
        f"`quarry up`, or give its address{flag or ''} (HOST:PORT)",
        "UNAVAILABLE",
    )


def _report(exc: BaseException, as_json: bool, services: dict[str, str] | None = None) -> int:
    """One failure, as one line or one JSON object on stderr; exit code 1."""
    if isinstance(exc, errors.QuarryError) and services is not None:
        exc = unreachable(exc, services) or exc
    if isinstance(exc, errors.QuarryError):
        return fail(
            exc.reason,
            _with_hint(exc),
            code=exc.code.name,
            metadata=exc.metadata,
            as_json=as_json,
        )
    if isinstance(exc, CliError):
        fail(exc.reason, exc.message, code=exc.code, as_json=as_json)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        code = _ERRNO_CODES.get(exc.errno or 0, "UNKNOWN")
        return fail("LOCAL_IO_ERROR", f"{exc.strerror or exc}{where}", code=code, as_json=as_json)
    return fail(
        "INTERNAL",
        f"{type(exc).__name__}: {exc} (set QUARRY_CLI_TRACEBACK=1 for details)",
        code="INTERNAL",
        as_json=as_json,
    )


@contextlib.contextmanager
def _held_stdout() -> Any:
    """stdout goes to a buffer (text, and bytes through .buffer) while the handler runs."""
    held = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(held):
        yield held


def _release(held: io.TextIOWrapper) -> None:
    held.flush()
    data = held.buffer.getvalue()  # type: ignore[attr-defined]
    if not data:
        return
    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)
    if binary is not None:
        binary.write(data)
    else:  # a text-only stream (a caller's io.StringIO)
        sys.stdout.write(data.decode("utf-8", errors="replace"))
    sys.stdout.flush()


def command(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Run a handler with a Context; every failure becomes one line (or one JSON object)
    on stderr and exit code 1, and stdout shows nothing of a command that failed."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        style.configure(getattr(args, "color", None), sys.stdout, sys.stderr)
        output.full_ids = bool(getattr(args, "full", False))
        ctx = Context(args)
        try:
            with _held_stdout() as held, traced_command(args):
                code = handler(args, ctx)
            _release(held)
            ctx.warn_skipped()
            return code
        except KeyboardInterrupt:
            print("\nquarry: INTERRUPTED: stopped by the user", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            raise  # main() treats `quarry ls ... | head` as success
        except (errors.QuarryError, CliError, OSError) as exc:
            return _report(exc, ctx.json, ctx.dialled())
        except Exception as exc:  # a bug; still no traceback for users
            if os.environ.get("QUARRY_CLI_TRACEBACK"):
                raise
            return _report(exc, ctx.json)
        finally:
            ctx.close()

    return run


# The CLI's spans: a short deadline for their export (a stopped receiver must not hold a
# finished command for OpenTelemetry's default 10 s).
CLI_EXPORT_TIMEOUT_SECONDS = "3"


def command_name(args: argparse.Namespace) -> str:
    """`quarry COMMAND [GROUP] [ACTION]` as typed, e.g. `quarry auth users create` (never the
    arguments: they may hold secrets); main.build_parser names every (sub)command."""
    return str(getattr(args, "command_name", None) or "quarry")


@contextlib.contextmanager
def traced_command(args: argparse.Namespace) -> Any:
    """The whole command as one span, the root of its trace, when tracing is asked for:
    `--trace` (exporting to `quarry traces` on this machine unless OTEL_EXPORTER_OTLP_*
    says where) or the OTEL_* variables, as for the services. The gRPC calls it makes
    carry its context, so the services' spans are its children; its spans are exported
    before the command returns."""
    from quarry import telemetry

    wanted = bool(getattr(args, "trace", False))
    if wanted and not telemetry.tracing_requested():
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = telemetry.DEFAULT_ENDPOINT
    if not (wanted or telemetry.tracing_requested()):
        yield
        return
    os.environ.setdefault("OTEL_EXPORTER_OTLP_TIMEOUT", CLI_EXPORT_TIMEOUT_SECONDS)
    if not telemetry.configure_tracing("cli"):  # OTEL_TRACES_EXPORTER=none: it warned, if need be
        yield
        return
    trace_id = 0
    try:
        with telemetry.root_span(command_name(args)) as span:
            trace_id = span.get_span_context().trace_id
            yield
    finally:
        telemetry.flush()
        if trace_id:  # to find it in `quarry traces` or a tracing backend
            print(f"quarry: trace {trace_id:032x}", file=sys.stderr)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def confirm(question: str, flag: str) -> None:
    """Ask on a terminal; elsewhere, refuse: the caller must pass `flag`."""
    if not sys.stdin.isatty():
        raise CliError(
            "CONFIRMATION_REQUIRED", f"{question} Pass {flag} to confirm.", "FAILED_PRECONDITION"
        )
    # The question goes to stderr: stdout is held until the command succeeds.
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("CANCELLED", "nothing was deleted", "CANCELLED")


def default_author() -> str:
    """The committer the CLI names when --author is not given: none, so the server records
    the authenticated principal (naming anyone else needs auth:CommitAsOtherUser)."""
    return ""


# ---- parsers -----------------------------------------------------------------------------


def address(text: str) -> str:
    """A HOST:PORT option: a usage error for anything gRPC could not dial as given (a port
    outside 1-65535 would be dialled modulo 65536, i.e. some other service)."""
    problem = config.address_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return text


def count_at_least_one(text: str) -> int:
    """A count option (-n, --staging-shards): a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def positive_seconds(text: str) -> float:
    """A duration option: a finite number of seconds above 0 (0, negative, nan and inf
    would fail every call at once with DEADLINE_EXCEEDED)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0 or value > 10**7:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def common_options() -> argparse.ArgumentParser:
    """The connection and output options every client subcommand takes."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--branch-manager",
        type=address,
        metavar="HOST:PORT",
        help="branch-manager address (default: QUARRY_BRANCH_MANAGER_ADDRESS)",
    )
    group.add_argument(
        "--committer",
        type=address,
        metavar="HOST:PORT",
        help="committer address (default: QUARRY_COMMITTER_ADDRESS)",
    )
    group.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="deadline of each call (default: 30)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        help="machine-readable JSON output; a failure is one JSON object on stderr",
    )
    group.add_argument(
        "--full",
        action="store_true",
        help="whole commit ids (default: their first 12 characters; --json: always whole)",
    )
    group.add_argument(
        "--trace",
        action="store_true",
        help="trace this command: its spans and the services' form one trace, sent to "
        "OTEL_EXPORTER_OTLP_ENDPOINT (default: `quarry traces` on this machine, "
        f"{DEFAULT_ENDPOINT})",
    )
    group.add_argument(
        "--color",
        choices=style.WHEN,
        default="auto",
        metavar="WHEN",
        help="colours: auto (terminals, unless NO_COLOR is set), always, never",
    )
    return common


def progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="draw progress on stderr even when it is not a terminal",
    )


def leaf(
    common: argparse.ArgumentParser,
    parent: Subparsers,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    help_text: str,
) -> argparse.ArgumentParser:
    """A subcommand that runs `handler`, with the common options."""
    parser = parent.add_parser(name, help=help_text, description=help_text, parents=[common])
    parser.set_defaults(func=handler)
    return parser


def group(sub: Subparsers, name: str, help_text: str) -> Subparsers:
    """A command whose actions are subcommands (`quarry repo create ...`)."""
    parser = sub.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


__all__ = [
    "CLI_RETRY",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "CliError",
    "UsageError",
    "EXIT_USAGE",
    "Context",
    "command",
    "fail",
    "flag_names",
    "REQUEST_FIELD_FLAGS",
    "key_value",
    "confirm",
    "default_author",
    "common_options",
    "progress_option",
    "leaf",
    "group",
    "Registration",
    "Subparsers",
]
