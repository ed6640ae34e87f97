"""Running an event's hooks and recording the run (docs/actions.md).

Pre-events: hooks run in order (files by path, hooks as written); the first failure stops
the run and raises HookFailed (FAILED_PRECONDITION / HOOK_FAILED naming action, hook and run
id) before the operation changes anything. Post-events: the same, but a failure is only
recorded; it never changes the operation's outcome.

KV (the repository's partition): `actions/runs/<run id>` one JSON record per run (its hooks
inside), `actions/secret` the repository's webhook signing secret (created on first use)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry import trace
from prometheus_client import Counter, Histogram

from quarry import errors
from quarry.actions import files, webhook
from quarry.graveler.model import Entry
from quarry.kv import store as kv
from quarry.runtime import deadlines

log = logging.getLogger(__name__)

# What a hook leaves of the caller's deadline for the answer to reach it (a tenth of what is
# left, at most this).
MAX_REPLY_MARGIN_SECONDS = 1.0
tracer = trace.get_tracer("quarry.actions")

RUNS_PREFIX = b"actions/runs/"
SECRET_KEY = b"actions/secret"
DEFAULT_TIMEOUT_SECONDS = 60.0
# Metarange ids remembered as holding no action file (quarry.graveler.actions._load).
EMPTY_CACHE_SIZE = 65_536

RUNS = Counter(
    "quarry_action_runs", "Action runs, by event and status", ["event", "status"], registry=None
)
HOOK_SECONDS = Histogram(
    "quarry_action_hook_seconds",
    "Webhook hook calls, by event and outcome",
    ["event", "status"],
    registry=None,
)
METRICS = (RUNS, HOOK_SECONDS)


class HookFailed(errors.FailedPrecondition):
    reason = "HOOK_FAILED"


@dataclass
class Event:
    """What a hook receives (the JSON body's fields, plus who is asked)."""

    event_type: str
    repository_id: str
    branch_id: str
    source_ref: str
    commit_message: str = ""
    committer: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    commit_id: str = ""  # post commit/merge: the commit made; branch/tag events: its commit
    tag_id: str = ""  # tag events


@dataclass
class HookResult:
    action_name: str
    hook_id: str
    status: str  # passed | failed
    http_status: int
    duration_seconds: float
    output: str
    error: str = ""


@dataclass
class Run:
    run_id: str
    event_type: str
    repository_id: str
    branch_id: str
    source_ref: str
    commit_id: str
    status: str  # running | passed | failed
    start_time: float
    end_time: float = 0.0
    error: str = ""
    hooks: list[HookResult] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Run:
        raw = json.loads(data)
        raw["hooks"] = [HookResult(**h) for h in raw.get("hooks", [])]
        return cls(**raw)


def new_run_id(now: float) -> str:
    """Newest first in key order (inverted microseconds), unique by a random tail."""
    return f"{(1 << 53) - int(now * 1e6):016x}{uuid.uuid4().hex[:8]}"


class Actions:
    """The actions engine a service runs with (the committer for commits and merges)."""

    def __init__(
        self,
        store: kv.Store,
        allowed_hosts: Iterable[str] = ("loopback",),
        max_timeout_seconds: float = 300.0,
        environ: Mapping[str, str] | None = None,
        object_settings: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kv = store
        self.allowed_hosts = tuple(h for h in allowed_hosts if h.strip())
        self.max_timeout_seconds = max_timeout_seconds
        self.environ = environ if environ is not None else os.environ
        # Where action files in an S3 namespace are read with (quarry.blob.open_object).
        self.object_settings = object_settings
        self.clock = clock
        # (storage namespace, metarange id) of trees known to hold no action file, newest
        # last (bounded: an LRU of ids, a few MB at most).
        self._empty: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._empty_lock = threading.Lock()

    def known_empty(self, key: tuple[str, str]) -> bool:
        with self._empty_lock:
            if key in self._empty:
                self._empty.move_to_end(key)
                return True
            return False

    def remember_empty(self, key: tuple[str, str]) -> None:
        with self._empty_lock:
            self._empty[key] = None
            while len(self._empty) > EMPTY_CACHE_SIZE:
                self._empty.popitem(last=False)

    # ---- action files ----------------------------------------------------------------------

    def load(self, entries: Iterable[tuple[str, Entry | None]]) -> list[files.Action]:
        """Parse the action files among `entries` (an iterator positioned at the first
        prefix, in path order); stops past the last prefix (one range lookup in all)."""
        actions = []
        end = files.PREFIXES[-1][:-1] + "0"  # "/" + 1: past every "_quarry_actions/..." path
        for path, entry in entries:
            if path >= end:
                break
            if entry is None or not files.is_action_path(path):
                continue
            actions.append(files.parse(path, self.read_action_file(path, entry)))
        return actions

    def read_action_file(self, path: str, entry: Entry) -> bytes:
        """An action file's bytes, checked against its entry as every reader checks them
        (quarry.blob.copy_object: the size, and the SHA-256 where the entry records one).
        Safety rule: the hooks that run are the file as committed, never bytes changed in
        storage since (an imported file's source edited in place would else turn a gate
        off without a commit): InvalidActionFile names the file instead. Over
        MAX_ACTION_FILE_BYTES, refused unread."""
        from quarry.blob import copy_object

        if entry.size_bytes > files.MAX_ACTION_FILE_BYTES:
            raise files.too_large(path, entry.size_bytes)
        data = bytearray()

        def write(chunk: bytes) -> None:
            data.extend(chunk)
            if len(data) > files.MAX_ACTION_FILE_BYTES:
                raise files.too_large(path, len(data))

        try:
            copy_object(
                entry.physical_address,
                write,
                self.object_settings,
                size_bytes=entry.size_bytes,
                checksum=entry.checksum,
            )
        except files.InvalidActionFile:
            raise
        except errors.QuarryError as unreadable:
            raise files.InvalidActionFile(
                f"invalid action file {path}: {unreadable.message}",
                metadata={"path": path, "line": "0", "cause": unreadable.reason},
            ) from None
        return bytes(data)

    # ---- runs ------------------------------------------------------------------------------

    def run(self, partition: bytes, event: Event, actions: list[files.Action]) -> Run | None:
        """Run the hooks of the actions that match; None when none match (nothing recorded).
        Pre-events raise HookFailed on the first failure (after recording the run)."""
        chosen = files.matching(actions, event.event_type, event.branch_id)
        if not chosen:
            return None
        started = self.clock()
        run = Run(
            new_run_id(started),
            event.event_type,
            event.repository_id,
            event.branch_id,
            event.source_ref,
            event.commit_id,
            "running",
            started,
        )
        failed: HookResult | None = None
        secret = self.secret(partition)
        for action in chosen:
            for hook in action.hooks:
                result = self._call(run, event, action, hook, secret)
                run.hooks.append(result)
                if result.status != "passed":
                    failed = result
                    break
            if failed:
                break
        run.status = "failed" if failed else "passed"
        run.end_time = self.clock()
        if failed:
            run.error = f"action {failed.action_name!r} hook {failed.hook_id!r}: {failed.error}"
        RUNS.labels(event.event_type, run.status).inc()
        self.record(partition, run)
        if failed and event.event_type.startswith("pre-"):
            raise HookFailed(
                f"{event.event_type} hook failed: action {failed.action_name!r}, hook "
                f"{failed.hook_id!r}, run {run.run_id}: {failed.error}",
                metadata={
                    "action": failed.action_name,
                    "hook": failed.hook_id,
                    "run_id": run.run_id,
                    "http_status": str(failed.http_status),
                },
            )
        return run

    def _call(
        self, run: Run, event: Event, action: files.Action, hook: files.Hook, secret: bytes
    ) -> HookResult:
        properties = hook.properties
        timeout = files.parse_duration(properties.get("timeout")) or DEFAULT_TIMEOUT_SECONDS
        timeout = min(timeout, self.max_timeout_seconds)
        # Never longer than the caller waits, less the time the answer needs to reach it: a
        # hook cut there is a failed hook, recorded (see record), not a thread working for
        # nobody; and a post-event hook (run before the answer) never turns an operation
        # that took effect into a DEADLINE_EXCEEDED for its caller.
        call = deadlines.current()
        remaining = call.remaining() if call is not None else None
        if remaining is not None:
            timeout = min(timeout, remaining - min(MAX_REPLY_MARGIN_SECONDS, remaining / 10))
        body = {
            **asdict(event),
            "event_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.start_time)),
            "action_name": action.name,
            "hook_id": hook.id,
            "run_id": run.run_id,
        }
        attributes = {
            "quarry.action": action.name,
            "quarry.hook": hook.id,
            "quarry.event": event.event_type,
            "quarry.run_id": run.run_id,
        }
        started = time.monotonic()
        with tracer.start_as_current_span("actions.hook", attributes=attributes) as span:
            try:
                query = [
                    (str(k), files.resolve_env(files.query_text(v), dict(self.environ)))
                    for k, values in (properties.get("query_params") or {}).items()
                    for v in (values if isinstance(values, list) else [values])
                ]
                headers = {
                    str(k): files.resolve_env(str(v), dict(self.environ))
                    for k, v in (properties.get("headers") or {}).items()
                }
                broken_header = next(
                    (k for k, v in headers.items() if any(c in v for c in "\r\n\x00")), None
                )
                if broken_header is not None:  # named, its value (a secret) never shown
                    raise errors.InvalidArgument(
                        f"header {broken_header!r}: its value from the environment holds a "
                        "line break or NUL"
                    )
                # A hook's own `secret` (an environment reference the receiver also knows)
                # signs instead of the repository's.
                own = properties.get("secret")
                if own:
                    secret = files.resolve_env(str(own), dict(self.environ)).encode()
                if timeout <= 0:
                    raise errors.DeadlineExceeded("not called: the caller's deadline passed")
                answer = webhook.post(
                    str(properties["url"]),
                    body,
                    query,
                    timeout,
                    secret,
                    self.allowed_hosts,
                    headers,
                )
            except errors.QuarryError as refused:
                answer = webhook.Response(0, b"", refused.message)
            except Exception as broken:  # a hook that cannot be called has failed
                # Recorded as this hook's failure (a pre-event then fails HOOK_FAILED, a
                # post-event's run shows it), never an INTERNAL answer without a run. Its
                # type only: the text of an error about a header can be the header's value,
                # a secret from the environment (runs are readable with fs:ReadActions).
                kind = type(broken).__name__
                log.warning(
                    "hook %s of action %s could not be called (%s)", hook.id, action.name, kind
                )
                answer = webhook.Response(0, b"", f"the hook could not be called ({kind})")
            duration = time.monotonic() - started
            passed = 200 <= answer.status < 300
            status = "passed" if passed else "failed"
            error = answer.error or ("" if passed else f"HTTP {answer.status}")
            span.set_attribute("http.status_code", answer.status)
            span.set_attribute("quarry.hook_status", status)
            if not passed:
                span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        HOOK_SECONDS.labels(event.event_type, status).observe(duration)
        return HookResult(
            action.name,
            hook.id,
            status,
            answer.status,
            duration,
            answer.output[: webhook.MAX_OUTPUT_BYTES].decode("utf-8", "replace"),
            error,
        )

    def fail_run(self, partition: bytes, event: Event, error: str) -> Run:
        """Record a run that could not start (e.g. an invalid action file)."""
        now = self.clock()
        run = Run(
            new_run_id(now),
            event.event_type,
            event.repository_id,
            event.branch_id,
            event.source_ref,
            event.commit_id,
            "failed",
            now,
            now,
            error,
        )
        RUNS.labels(event.event_type, "failed").inc()
        self.record(partition, run)
        return run

    # ---- KV ------------------------------------------------------------------------------

    def secret(self, partition: bytes) -> bytes:
        """The repository's signing secret: created once (SetIf absent), then read."""
        try:
            return self.kv.get(partition, SECRET_KEY).value
        except kv.KeyNotFound:
            pass
        fresh = secrets.token_hex(32).encode()
        try:
            self.kv.set_if(partition, SECRET_KEY, fresh, kv.ABSENT)
            return fresh
        except kv.PredicateFailed:
            return self.kv.get(partition, SECRET_KEY).value

    def record(self, partition: bytes, run: Run) -> None:
        """Keep the run's record. Written with a deadline of its own, not the caller's: a
        run whose hooks were called is recorded even when the caller's deadline passed
        meanwhile (the hooks may have acted; `actions runs` must show that they ran)."""
        try:
            with deadlines.serving(None):
                self.kv.set(partition, RUNS_PREFIX + run.run_id.encode(), run.to_json())
        except errors.QuarryError:
            log.exception("could not record action run %s", run.run_id)

    def get_run(self, partition: bytes, run_id: str) -> Run:
        try:
            return Run.from_json(self.kv.get(partition, RUNS_PREFIX + run_id.encode()).value)
        except kv.KeyNotFound:
            raise errors.NotFound(
                f"action run {run_id!r} not found", metadata={"run_id": run_id}
            ) from None

    def list_runs(
        self,
        partition: bytes,
        branch: str = "",
        commit_id: str = "",
        page_size: int = 100,
        after: str = "",
    ) -> tuple[list[Run], str]:
        """Newest first; filtered by branch and/or commit; (runs, next run id or "")."""
        start = RUNS_PREFIX + (after.encode() + b"\x00" if after else b"")
        end = RUNS_PREFIX[:-1] + b"0"
        runs: list[Run] = []
        iterator = self.kv.scan(partition, start, end)
        try:
            for item in iterator:
                run = Run.from_json(item.value)
                if branch and run.branch_id != branch:
                    continue
                if commit_id and run.commit_id != commit_id:
                    continue
                runs.append(run)
                if len(runs) >= page_size:
                    return runs, run.run_id
        finally:
            iterator.close()
        return runs, ""


def install(graveler: Any, settings: Any) -> None:
    """Run actions in this service (the committer: commits and merges; branch-manager:
    branches and tags) per the settings, and expose their metrics."""
    if not settings.actions_enabled:
        return
    from quarry.telemetry.metrics import expose

    graveler.actions = Actions(
        graveler.kv,
        allowed_hosts=settings.actions_allowed_hosts.split(","),
        max_timeout_seconds=settings.actions_max_timeout_seconds,
        # Action files in an S3 namespace: read with this service's S3 settings.
        object_settings=settings,
    )
    expose(*METRICS)
