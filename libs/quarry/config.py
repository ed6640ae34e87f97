"""Settings: one frozen object, every setting listed here with its default.

Sources, later wins: the defaults below → an optional TOML file (path in QUARRY_CONFIG_FILE;
keys are the field names, e.g. `kv_url = "memory://"`) → `QUARRY_<FIELD>` environment
variables (upper case, e.g. QUARRY_KV_URL). The README's settings table is generated from
SETTINGS_DOC by `quarry settings`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from quarry import errors

SERVICES = ("kv-gateway", "branch-manager", "committer", "compactor-sensor", "range-writer")


@dataclass(frozen=True)
class Settings:
    # Where the embedded defaults keep their data (SQLite file, local object store, caches).
    home: str = "./.quarry"
    # The KV backend the kv-gateway serves: sqlite:///PATH, memory://,
    # dynamodb://TABLE?region=R&endpoint_url=URL. Empty = sqlite under `home`.
    kv_url: str = ""
    # Address services bind to. 0.0.0.0 in a cluster.
    listen_host: str = "127.0.0.1"
    kv_gateway_port: int = 7401
    branch_manager_port: int = 7402
    committer_port: int = 7403
    compactor_sensor_port: int = 7404
    range_writer_port: int = 7405
    # Where clients and services dial each other.
    kv_gateway_address: str = "127.0.0.1:7401"
    branch_manager_address: str = "127.0.0.1:7402"
    committer_address: str = "127.0.0.1:7403"
    compactor_sensor_address: str = "127.0.0.1:7404"
    range_writer_address: str = "127.0.0.1:7405"
    # Prometheus endpoints: one per service, port = metrics_base_port + service index
    # (kv-gateway 9401 … range-writer 9405). 0 disables them.
    metrics_host: str = "127.0.0.1"
    metrics_base_port: int = 9401
    # Worker threads per gRPC server.
    max_workers: int = 32
    # Seconds in-flight calls get to finish after SIGTERM.
    shutdown_grace_seconds: float = 10.0
    # Every paged response (ListObjects, Diff, Log, List*, ...) and every streamed
    # ScanItems message ends before its encoded size would pass this many bytes and
    # continues with next_page_token (but always holds at least one item). The default
    # stays 194,304 bytes under gRPC's 4 MiB default receive limit, so grpcurl and other
    # default clients can read any page.
    max_response_bytes: int = 4_000_000
    # kv-gateway: identical GetItems that arrive while a read of the same key is in flight
    # share the next backend read.
    kv_amortize_reads: bool = True
    # kv-gateway: reproduce DynamoDB hot-partition throttling locally.
    kv_limiter_enabled: bool = False
    kv_limiter_read_units_per_second: float = 3000.0
    kv_limiter_write_units_per_second: float = 1000.0
    # Local disk cache for immutable ranges and metaranges. Empty = `home`/cache.
    cache_dir: str = ""
    # S3 object store: endpoint override (e.g. a local S3-compatible server) and region.
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    # Skip the staging partition on reads of clean branches (ARCHITECTURE.md §4).
    experimental_dirty_read_optimization: bool = True
    # Retired staging tokens wait this long in the cleanup queue before their items are
    # deleted (readers still holding the old branch record finish first).
    staging_drop_grace_seconds: float = 10.0
    # How often the background dropper looks at the cleanup queue.
    staging_drop_interval_seconds: float = 5.0

    # Staging compaction (ARCHITECTURE.md §4). branch-manager reports staged writes to the
    # compactor-sensor, which asks the committer to compact branches past a threshold.
    # Off: branch-manager sends no reports and the sensor never triggers a compaction.
    compactor_enabled: bool = True
    # Compact a branch once its staging and sealed tokens hold this many tombstones
    # (staged deletes). 0 disables this threshold.
    compaction_tombstones_threshold: int = 100000
    # Compact a branch once its staging and sealed tokens hold this many staged items
    # (entries plus tombstones). 0 disables this threshold.
    compaction_staged_entries_threshold: int = 1000000
    # Compact a branch once it has this many sealed tokens (a sign commits keep failing).
    # 0 disables this threshold.
    compaction_sealed_tokens_threshold: int = 10
    # At most one compaction per branch within this many seconds, across every sensor
    # replica (guarded by the branch record's compaction_start_time through SetIf).
    compaction_min_interval_seconds: float = 60.0
    # How often the compactor-sensor evaluates branches against the thresholds.
    compaction_check_interval_seconds: float = 5.0
    # How often branch-manager sends its batched staging reports to the compactor-sensor
    # (a batch that cannot be delivered is dropped; writes never wait for the sensor).
    staging_report_interval_seconds: float = 0.5

    # Request ids (AIP-155): a repeat of a mutating call with the same request_id within
    # this many seconds returns the first call's result and changes nothing; older records
    # count as absent (a repeat runs again).
    request_retention_seconds: float = 86400.0
    # A call holding a request id renews its in-progress claim while it runs; a claim not
    # renewed for this many seconds (its process died) may be taken over by a repeat.
    request_lease_seconds: float = 30.0

    # Python logging level of the services (DEBUG, INFO, WARNING, ERROR).
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.max_response_bytes < 1:
            raise errors.InvalidArgument(
                f"setting max_response_bytes must be positive, not {self.max_response_bytes}")

    def port_of(self, service: str) -> int:
        return getattr(self, _attr(service, "port"))

    def address_of(self, service: str) -> str:
        return getattr(self, _attr(service, "address"))

    def metrics_port_of(self, service: str) -> int:
        if self.metrics_base_port <= 0:
            return 0
        return self.metrics_base_port + SERVICES.index(service)

    @property
    def effective_kv_url(self) -> str:
        return self.kv_url or f"sqlite:///{Path(self.home).resolve() / 'kv.db'}"

    @property
    def effective_cache_dir(self) -> str:
        return self.cache_dir or str(Path(self.home).resolve() / "cache")

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


def _attr(service: str, suffix: str) -> str:
    if service not in SERVICES:
        raise errors.InvalidArgument(f"unknown service {service!r}; known: {', '.join(SERVICES)}")
    return f"{service.replace('-', '_')}_{suffix}"


ENV_PREFIX = "QUARRY_"
CONFIG_FILE_ENV = "QUARRY_CONFIG_FILE"


def _coerce(name: str, raw: Any, kind: type) -> Any:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise errors.InvalidArgument(
            f"setting {name}: {raw!r} is not a valid {kind.__name__}") from None


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Defaults → TOML file → QUARRY_* environment → explicit overrides (for tests)."""
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    kinds = {name: type(f.default) for name, f in fields.items()}
    values: dict[str, Any] = {}

    config_file = env.get(CONFIG_FILE_ENV)
    if config_file:
        with open(config_file, "rb") as fh:
            for name, raw in tomllib.load(fh).items():
                if name not in fields:
                    raise errors.InvalidArgument(f"{config_file}: unknown setting {name!r}")
                values[name] = _coerce(name, raw, kinds[name])

    for name in fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(ENV_PREFIX + name.upper(), raw, kinds[name])

    for name, raw in overrides.items():
        if name not in fields:
            raise errors.InvalidArgument(f"unknown setting {name!r}")
        values[name] = raw
    return Settings(**values)


def settings_table() -> list[tuple[str, str, str]]:
    """(environment variable, default, description) for every setting, in declaration order."""
    import inspect

    source = inspect.getsource(Settings)
    names = {f.name for f in dataclasses.fields(Settings)}
    comments: dict[str, str] = {}
    # A comment block describes every field that follows it until the next comment.
    block: list[str] = []
    previous_was_comment = False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not previous_was_comment:
                block = []
            block.append(stripped.lstrip("# "))
            previous_was_comment = True
            continue
        previous_was_comment = False
        if not stripped:
            block = []  # a blank line ends a comment block's reach
            continue
        head = stripped.split(":", 1)[0]
        if head in names:
            comments[head] = " ".join(block)
    return [(ENV_PREFIX + f.name.upper(), _display(f.default), comments.get(f.name, ""))
            for f in dataclasses.fields(Settings)]


def _display(default: Any) -> str:
    if isinstance(default, bool):
        return "true" if default else "false"
    if default == "":
        return "(empty)"
    return str(default)
