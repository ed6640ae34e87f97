"""Settings: one frozen object; every setting describes itself where it is declared.

Each field carries its description in its metadata (`_setting(default, description)`); its
environment variable is `QUARRY_<FIELD>` (upper case) and its type is the field's annotation.
`describe_settings()` reads exactly that, and the README's settings table is generated from
it by `quarry settings --markdown` (`settings_markdown`); tests/unit/test_readme.py fails when
the two disagree.

Sources, later wins: the defaults below → an optional TOML file (path in QUARRY_CONFIG_FILE;
keys are the field names, e.g. `kv_url = "memory://"`) → `QUARRY_<FIELD>` environment
variables (e.g. QUARRY_KV_URL).

`*_address` settings left empty follow the matching `*_port` (and the listen host, when it
names one host): changing QUARRY_KV_GATEWAY_PORT moves both the kv-gateway's listener and
the address every other service and the CLI dial. An address given explicitly is kept.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from quarry import errors

# The longest a bearer token may live (exp - iat): TokenAuthority refuses to issue or accept
# a longer one, so a leaked token is useless after at most a day.
MAX_TOKEN_LIFETIME_SECONDS = 86_400

SERVICES = (
    "kv-gateway",
    "branch-manager",
    "committer",
    "compactor-sensor",
    "range-writer",
    "s3-gateway",
    "console",
)

LOG_FORMATS = ("text", "json")
ENV_PREFIX = "QUARRY_"
CONFIG_FILE_ENV = "QUARRY_CONFIG_FILE"
DEFAULT_DIAL_HOST = "127.0.0.1"
# How long a process may use a repository record it read earlier (RefManager's cache): a
# reader holding a stale one can still read the staging tokens of that repository instance,
# so retired tokens must outlive it (staging_drop_grace_seconds, checked below).
REPOSITORY_CACHE_SECONDS = 2.0
# Listen hosts that name no single host to dial: a derived address dials DEFAULT_DIAL_HOST.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def _setting(default: Any, description: str, *, shown_default: str | None = None) -> Any:
    """A settings field: its default and its description (and, for a default computed from
    other settings, how the table shows it)."""
    metadata = {"description": description}
    if shown_default is not None:
        metadata["shown_default"] = shown_default
    return field(default=default, metadata=metadata)


def _port(service: str, port: int) -> Any:
    return _setting(
        port,
        f"TCP port the {service} listens on (with QUARRY_LISTEN_HOST). "
        f"Also the port others dial unless QUARRY_{_upper(service)}_ADDRESS is set.",
    )


# gRPC targets with a resolver scheme (dns:///host:port, unix:/path, ...) are passed on as
# given; anything else must be HOST:PORT.
_GRPC_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:")


def address_problem(address: str) -> str | None:
    """Why `address` cannot be dialled as a service address, or None. A malformed one would
    leave a service waiting for its dependency forever, and a port above 65535 would be
    dialled modulo 65536, i.e. some other service."""
    if address.startswith(_GRPC_TARGET_SCHEMES):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not host.strip("[]"):
        return "must be HOST:PORT"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return "must be HOST:PORT with a port 1-65535"
    if any(c.isspace() or c in "/?#@" for c in host) or (":" in host and host[0] != "["):
        return "must be HOST:PORT (an IPv6 host in brackets)"
    return None


def _address(service: str, port: int) -> Any:
    return _setting(
        "",
        f"host:port where the CLI, clients and the other services dial the "
        f"{service}. Empty: QUARRY_LISTEN_HOST (127.0.0.1 when it is a wildcard "
        f"such as 0.0.0.0) and QUARRY_{_upper(service)}_PORT, so changing the port "
        "moves both ends.",
        shown_default=f"{DEFAULT_DIAL_HOST}:{port}",
    )


def _upper(service: str) -> str:
    return service.upper().replace("-", "_")


@dataclass(frozen=True)
class Settings:
    home: str = _setting(
        "./.quarry",
        "Where the embedded defaults keep their data (SQLite file, local object store, caches).",
    )
    kv_url: str = _setting(
        "",
        "The KV backend the kv-gateway serves: sqlite:///PATH, memory://, "
        "dynamodb://TABLE?region=R&endpoint_url=URL. Empty = sqlite under `home`.",
    )
    listen_host: str = _setting(
        "127.0.0.1", "Host (interface address) every service binds to. 0.0.0.0 in a cluster."
    )
    kv_gateway_port: int = _port("kv-gateway", 7401)
    branch_manager_port: int = _port("branch-manager", 7402)
    committer_port: int = _port("committer", 7403)
    compactor_sensor_port: int = _port("compactor-sensor", 7404)
    range_writer_port: int = _port("range-writer", 7405)
    s3_gateway_port: int = _port("s3-gateway", 7406)
    console_port: int = _port("console", 7407)
    kv_gateway_address: str = _address("kv-gateway", 7401)
    branch_manager_address: str = _address("branch-manager", 7402)
    committer_address: str = _address("committer", 7403)
    compactor_sensor_address: str = _address("compactor-sensor", 7404)
    range_writer_address: str = _address("range-writer", 7405)
    s3_gateway_address: str = _address("s3-gateway", 7406)
    console_address: str = _address("console", 7407)
    metrics_host: str = _setting("127.0.0.1", "Host the Prometheus endpoints bind to.")
    metrics_base_port: int = _setting(
        9401,
        "Prometheus endpoints: one per service, port = this + service index "
        "(kv-gateway 9401 … range-writer 9405, s3-gateway 9406, console 9407). 0 disables "
        "them.",
    )
    max_workers: int = _setting(32, "Worker threads per gRPC server (per worker process).")
    branch_manager_workers: int = _setting(
        1,
        "branch-manager: worker processes serving its one port (SO_REUSEPORT; the kernel "
        "spreads connections over them), each a whole branch-manager with its own caches "
        "and threads, so a hot branch uses more than one core. 1: one process, no "
        "supervisor. 0: one per CPU core this process may use (its affinity and cgroup CPU "
        "limit), no more than its container's memory limit holds — what `quarry up` and the "
        "Helm chart use unless this is set. Their metrics "
        "are summed on the one metrics port (README: multi-process serving).",
    )
    committer_workers: int = _setting(
        1,
        "committer: worker processes serving its one port, as branch_manager_workers (each "
        "a whole committer; commits of one branch stay serialized by its record's CAS, as "
        "across replicas), so commits and merges of different branches use more than one "
        "core. 1: one process, no supervisor. 0: one per CPU core this process may use.",
    )
    s3_gateway_staging_batch: int = _setting(
        100,
        "s3-gateway: concurrent PUTs of one user to one branch share a staging call (one "
        "PutObjects message of up to this many entries) when two calls for that branch are "
        "already in flight; an uncontended PUT is one PutObject. 1: every PUT stages with a "
        "call of its own.",
    )
    s3_gateway_workers: int = _setting(
        1,
        "s3-gateway: worker processes serving its one port, as branch_manager_workers (each "
        "a whole gateway with its own signature cache and threads; the sweep of abandoned "
        "multipart uploads runs in the first only), so S3 requests use more than one core. "
        "1: one process, no supervisor. 0: one per CPU core this process may use.",
    )
    shutdown_grace_seconds: float = _setting(
        10.0, "Seconds in-flight calls get to finish after SIGTERM."
    )
    max_response_bytes: int = _setting(
        4_000_000,
        "Every paged response (ListObjects, Diff, Log, List*, ...) and every streamed "
        "ScanItems message ends before its encoded size would pass this many bytes and "
        "continues with next_page_token (but always holds at least one item). The default "
        "stays 194,304 bytes under gRPC's 4 MiB default receive limit, so grpcurl and other "
        "default clients can read any page. 4 KiB of it are kept for the page token and the "
        "response's other fields: a limit under ~8 KB leaves room for a few items per page.",
    )
    max_put_objects_stream_entries: int = _setting(
        1_000_000,
        "branch-manager: a PutObjects stream is checked whole before any of it is staged "
        "(a refusal stages nothing), so it is held in memory until it ends (~270 bytes per "
        "typical entry); a stream with more entries is refused with PUT_STREAM_TOO_LARGE "
        "before anything is staged. Larger loads take several calls. Once checked it is "
        "staged message by message: a failure midway (the kv-gateway lost) leaves the "
        "messages before it staged, and sending the stream again completes it.",
    )
    max_put_objects_stream_bytes: int = _setting(
        512 * 1024 * 1024,
        "branch-manager: the same bound on a PutObjects stream's encoded size (it caps the "
        "memory of a stream of entries with large metadata).",
    )
    kv_amortize_reads: bool = _setting(
        True,
        "kv-gateway: identical GetItems that arrive while a read of the same key is in "
        "flight share the next backend read.",
    )
    kv_limiter_enabled: bool = _setting(
        False, "kv-gateway: reproduce DynamoDB hot-partition throttling locally."
    )
    kv_limiter_read_units_per_second: float = _setting(
        3000.0,
        "kv-gateway limiter: read capacity units per second per partition (DynamoDB's "
        "per-partition limit) before reads are throttled.",
    )
    kv_limiter_write_units_per_second: float = _setting(
        1000.0,
        "kv-gateway limiter: write capacity units per second per partition before writes "
        "are throttled.",
    )
    kv_throttle_retries: int = _setting(
        8,
        "kv-gateway on DynamoDB: a throttled call (ProvisionedThroughputExceeded, "
        "ThrottlingException, ...) is retried this many times before the caller gets "
        "RESOURCE_EXHAUSTED with a retry delay.",
    )
    kv_throttle_backoff_base_seconds: float = _setting(
        0.05,
        "kv-gateway on DynamoDB: the first backoff after a throttled call; each next one "
        "doubles up to kv_throttle_backoff_cap_seconds, each times a random 0-1 (full "
        "jitter, which spreads many clients of one hot partition).",
    )
    kv_throttle_backoff_cap_seconds: float = _setting(
        2.0, "kv-gateway on DynamoDB: the longest backoff after a throttled call."
    )
    cache_dir: str = _setting(
        "", "Local disk cache for immutable ranges and metaranges. Empty = `home`/cache."
    )
    range_cache_bytes: int = _setting(
        256 * 1024 * 1024,
        "Memory cache of decoded ranges, per process that reads or writes committed data "
        "(branch-manager, committer, range-writer): a read, commit or merge whose ranges "
        "are cached reads no file. Arrow buffers are counted once however many cached "
        "ranges share them. A process's resident memory settles at about twice what its "
        "caches charge plus ~150 MB (measured: ~810 MB with the defaults once they are "
        "full): size the pods' memory limits for that, per worker process "
        "(quarry_range_cache_bytes beside process_resident_memory_bytes shows it). In a "
        "container with a memory limit, a service's processes shrink both caches (in "
        "proportion, with a warning in the log) until they fit in three quarters of it. "
        "0 disables it.",
    )
    metarange_cache_bytes: int = _setting(
        64 * 1024 * 1024,
        "Memory cache of decoded metaranges (and their index pages), per process like "
        "range_cache_bytes. 0 disables it.",
    )
    s3_endpoint_url: str = _setting(
        "", "S3 object store endpoint override (e.g. a local S3-compatible server)."
    )
    s3_region: str = _setting("us-east-1", "S3 object store region.")
    s3_gateway_region: str = _setting(
        "us-east-1",
        "s3-gateway: the region it answers GetBucketLocation with; clients sign with any.",
    )
    s3_gateway_domain: str = _setting(
        "",
        "s3-gateway: virtual-host addressing for this domain (a request to "
        "REPO.DOMAIN names bucket REPO); path-style addressing always works. Empty: "
        "path-style only.",
    )
    http_idle_seconds: float = _setting(
        60.0,
        "s3-gateway and console: a request whose client sends nothing of its body, or reads "
        "nothing of the answer, for this long is dropped, freeing its worker thread (a few "
        "stalled clients must not take every thread). Health checks never wait behind them.",
    )
    s3_gateway_max_skew_seconds: int = _setting(
        900,
        "s3-gateway: a signed request whose X-Amz-Date is further than this from the "
        "gateway's clock is refused (RequestTimeTooSkewed), as S3 does (15 minutes).",
    )
    s3_gateway_cache_seconds: float = _setting(
        10.0,
        "s3-gateway: how long it checks a credential's signatures itself with the scoped "
        "signing key the Auth service derived (never the secret) after Auth verified one, and "
        "reuses a user's repository and branch lookups. A revoked credential stops working "
        "within this time. 0: every request asks Auth.",
    )
    s3_gateway_multipart_expiry_seconds: float = _setting(
        7 * 86400.0,
        "s3-gateway: a multipart upload nothing was written to (record or part) for this "
        "long is abandoned: its record and parts are removed by the gateway's background "
        "sweep (QUARRY_S3_GATEWAY_MULTIPART_SWEEP_SECONDS); an upload written to within it "
        "is never touched. 0: never.",
    )
    s3_gateway_multipart_sweep_seconds: float = _setting(
        600.0,
        "s3-gateway: how often each gateway process sweeps every repository's namespace for "
        "abandoned multipart uploads (a background task; one listing of _s3_multipart/ per "
        "repository and pass, the first pass one interval after start). 0: no sweep "
        "(abandoned uploads stay until aborted).",
    )
    console_max_upload_bytes: int = _setting(
        5 * 1024**3,
        "console: the largest file its object browser uploads (streamed into the storage "
        "namespace, never held in memory); a larger one is refused with UPLOAD_TOO_LARGE "
        "(413) and nothing of it is kept or staged.",
    )
    range_writer_peers: str = _setting(
        "",
        "range-writer: other range-writer replicas a large apply is fanned out to, in key "
        "spans applied in parallel (docs/performance.md, scale-out): comma-separated "
        "host:port, or one dns:///NAME:PORT of a headless Service (gRPC round_robin spreads "
        "the spans over its pods; set QUARRY_RANGE_WRITER_SPANS). Empty: every apply runs "
        "in the range-writer that receives it.",
    )
    range_writer_spans: int = _setting(
        0,
        "range-writer: spans per fanned-out apply, one applied here and the others by the "
        "worker processes and peers. 0 = one per worker process and peer address, plus one.",
    )
    range_writer_processes: int = _setting(
        0,
        "range-writer: worker processes on this machine that apply spans of large applies "
        "alongside the range-writer (an apply's range work holds one core per process; "
        "docs/performance.md, scale-out). Each has its own caches of the sizes above. "
        "0: none.",
    )
    range_writer_span_timeout_seconds: float = _setting(
        600.0,
        "range-writer: how long it waits for a worker process or a peer to return a span "
        "before it applies the span itself; worker processes that did not answer (stopped, "
        "deadlocked, stuck on storage) are then killed and started afresh. Workers and peers "
        "are capacity, never something a commit waits on forever.",
    )
    range_writer_fan_out_min_changes: int = _setting(
        500,
        "range-writer: applies with fewer changes run here whole, as do applies whose "
        "changes fall into fewer than 32 ranges per span (a span's round trip costs more "
        "than it saves).",
    )
    import_heartbeat_seconds: float = _setting(
        10.0,
        "committer: a running import rewrites its status record (objects listed, heartbeat) "
        "at most this often; a cancel asked of another committer process is noticed then.",
    )
    import_listing_processes: int = _setting(
        2,
        "committer: processes that read a local directory an import lists, directories "
        "read ahead in parallel and used in key order (docs/import.md); 0: the import's "
        "thread walks it alone. S3 sources are listed by the import's thread.",
    )
    import_local_prefixes: str = _setting(
        "",
        "Local directories (comma-separated absolute paths) below which an entry may point "
        "at a file outside its repository's storage namespace: `quarry import` of a local "
        "directory and PutObject with such an address (fs:ImportFromStorage). Empty: none, "
        "as lakeFS's allowed_external_prefixes. QUARRY_HOME and other repositories' "
        "namespaces are never reachable, whatever this says.",
    )
    import_stale_seconds: float = _setting(
        60.0,
        "An import whose status record is older than this while RUNNING reads as FAILED: "
        "its committer process stopped (the branch is unchanged; run the import again).",
    )
    actions_enabled: bool = _setting(
        True,
        "Run the hooks of action files (_quarry_actions/*.yaml): the committer on commits, "
        "merges, reverts, cherry-picks and imports, branch-manager on branches and tags "
        "(docs/actions.md); off: no action file is read.",
    )
    actions_allowed_hosts: str = _setting(
        "loopback",
        "Comma-separated hosts webhook hooks may call (`*.example.com` for subdomains, "
        "`loopback` for 127.0.0.0/8, ::1 and localhost; empty: any host). Link-local and "
        "metadata addresses (169.254.0.0/16, fd00:ec2::254) are refused whatever this says.",
    )
    actions_max_timeout_seconds: float = _setting(
        300.0, "The longest timeout a webhook hook may ask for (its default is 60 s)."
    )
    experimental_dirty_read_optimization: bool = _setting(
        True, "Skip the staging partition on reads of clean branches (docs/architecture.md §4)."
    )
    staging_drop_grace_seconds: float = _setting(
        10.0,
        "Retired staging tokens wait this long in the cleanup queue before their items are "
        "deleted (readers still holding the old branch record finish first). Must be longer "
        "than the 2 s repository cache: a shorter grace refuses to start.",
    )
    staging_drop_interval_seconds: float = _setting(
        5.0, "How often the background dropper looks at the cleanup queue."
    )
    branch_retry_attempts: int = _setting(
        10,
        "branch-manager, committer: how many times an operation whose branch record changed "
        "under it (a write's validation, a commit, a reset, a branch deletion, an import's "
        "commit) is tried before it fails with BRANCH_CONTENDED (ABORTED, which clients "
        "retry). Raise it for branches with many concurrent writers and committers.",
    )
    branch_retry_base_seconds: float = _setting(
        0.002,
        "The backoff between those attempts (and a merge's): the first waits this long, each "
        "next one twice as long up to branch_retry_cap_seconds, each times a random 0.5-1.",
    )
    branch_retry_cap_seconds: float = _setting(
        0.2, "The longest backoff between two attempts on a contended branch."
    )
    merge_retry_attempts: int = _setting(
        5,
        "committer: attempts of a merge whose destination branch moved while it merged "
        "(each merges its previous result onto the new head) before it fails with "
        "HEAD_MOVED and a hint to resume from.",
    )
    compactor_enabled: bool = _setting(
        True,
        "Staging compaction (docs/architecture.md §4): branch-manager reports staged writes "
        "to the compactor-sensor, which asks the committer to compact branches past a "
        "threshold. Off: branch-manager sends no reports and the sensor never triggers a "
        "compaction.",
    )
    compaction_tombstones_threshold: int = _setting(
        100000,
        "Compact a branch once its staging and sealed tokens hold this many tombstones "
        "(staged deletes). 0 disables this threshold.",
    )
    compaction_staged_entries_threshold: int = _setting(
        1000000,
        "Compact a branch once its staging and sealed tokens hold this many staged items "
        "(entries plus tombstones). 0 disables this threshold.",
    )
    compaction_sealed_tokens_threshold: int = _setting(
        10,
        "Compact a branch once it has this many sealed tokens (a sign commits keep failing). "
        "0 disables this threshold.",
    )
    compaction_min_interval_seconds: float = _setting(
        60.0,
        "At most one compaction per branch within this many seconds, across every sensor "
        "replica (guarded by the branch record's compaction_start_time through SetIf).",
    )
    compaction_check_interval_seconds: float = _setting(
        5.0, "How often the compactor-sensor evaluates branches against the thresholds."
    )
    staging_report_interval_seconds: float = _setting(
        0.5,
        "How often branch-manager sends its batched staging reports to the compactor-sensor "
        "(a batch that cannot be delivered is dropped; writes never wait for the sensor).",
    )
    request_retention_seconds: float = _setting(
        86400.0,
        "Request ids (AIP-155): a repeat of a mutating call with the same request_id within "
        "this many seconds returns the first call's result and changes nothing; older "
        "records count as absent (a repeat runs again).",
    )
    request_lease_seconds: float = _setting(
        30.0,
        "A call holding a request id renews its in-progress claim while it runs; a claim not "
        "renewed for this many seconds (its process died) may be taken over by a repeat.",
    )
    auth_enabled: bool = _setting(
        True,
        "Authentication and authorization on every public RPC (`authorization: Bearer "
        "<token>`, policies of the IAM store). Off only for benchmarks or a trusted dev box.",
    )
    auth_signing_key: str = _setting(
        "",
        "HS256 key (at least 32 bytes) that signs user and service tokens; the same on every "
        "service. Empty: read QUARRY_AUTH_SIGNING_KEY_FILE.",
    )
    auth_signing_key_file: str = _setting(
        "",
        "File holding the signing key when QUARRY_AUTH_SIGNING_KEY is empty. `quarry up` "
        "creates it (mode 0600, 32 random bytes as hex) when missing; `quarry serve` refuses "
        "to start with auth on and no key.",
        shown_default="`home`/signing.key",
    )
    auth_token_lifetime_seconds: int = _setting(
        3600,
        "Lifetime of the tokens Auth/Login issues and of the services' own tokens "
        "(at most 86400: no token living longer is accepted).",
    )
    auth_login_attempts_per_minute_per_key: int = _setting(
        60,
        "Auth/Login attempts admitted per access key id per minute (a minute's worth at "
        "once, then refilling); more are RESOURCE_EXHAUSTED / LOGIN_THROTTLED with a retry "
        "hint. Each attempt costs a scrypt. Per branch-manager process: its worker processes "
        "(QUARRY_BRANCH_MANAGER_WORKERS) share it, each admitting its part.",
    )
    auth_login_attempts_per_minute_per_address: int = _setting(
        300, "Auth/Login attempts admitted per client address per minute (as per key)."
    )
    console_session_key: str = _setting(
        "",
        "Key (at least 32 bytes) that seals the console's session cookies (AES-256-GCM); the "
        "same on every console replica, so a session works on any of them and survives a "
        "restart. Empty: read QUARRY_CONSOLE_SESSION_KEY_FILE.",
    )
    console_session_key_file: str = _setting(
        "",
        "File holding the console's session key when QUARRY_CONSOLE_SESSION_KEY is empty. "
        "`quarry up` creates it (mode 0600, 32 random bytes as hex) when missing; "
        "`quarry serve console` refuses to start without a key.",
        shown_default="`home`/console-session.key",
    )
    console_session_seconds: int = _setting(
        3600,
        "Longest a console sign-in lasts; a session also ends when its Auth/Login token "
        "expires (QUARRY_AUTH_TOKEN_LIFETIME_SECONDS), whichever comes first.",
    )
    console_login_attempts_per_minute_per_address: int = _setting(
        20,
        "Sign-ins the console admits per browser address per minute before it calls "
        "Auth/Login (a minute's worth at once, then refilling; more get 429 with Retry-After). "
        "Branch-manager's own per-address throttle sees the console as one address for all its "
        "users: keep this well below QUARRY_AUTH_LOGIN_ATTEMPTS_PER_MINUTE_PER_ADDRESS so one "
        "browser cannot use up everyone's share. Per access key id the console also applies "
        "QUARRY_AUTH_LOGIN_ATTEMPTS_PER_MINUTE_PER_KEY.",
    )
    auth_cache_seconds: float = _setting(
        5.0,
        "Each process caches a user's effective policies (and that its user and access key "
        "exist) this long: a deleted user, revoked credential or detached policy takes "
        "effect within it.",
    )
    tls_cert_file: str = _setting(
        "",
        "PEM certificate (chain) of this process. Set with QUARRY_TLS_KEY_FILE: every server "
        "of the process serves TLS, and its client channels use TLS and present it as their "
        "client certificate (mTLS). Empty: plaintext (docs/tls.md).",
    )
    tls_key_file: str = _setting(
        "", "PEM private key (unencrypted) of QUARRY_TLS_CERT_FILE; both or neither."
    )
    tls_ca_file: str = _setting(
        "",
        "PEM bundle of the CA certificates servers are verified against; set, every client "
        "channel uses TLS (CLI, Python client, Spark, the services' own calls). With "
        "QUARRY_TLS_CLIENT_AUTH, also the CAs client certificates must chain to. Empty with "
        "QUARRY_TLS_CERT_FILE set: gRPC's built-in public roots.",
    )
    tls_client_auth: bool = _setting(
        False,
        "mTLS: servers require a client certificate signed by a CA of QUARRY_TLS_CA_FILE "
        "(needs QUARRY_TLS_CERT_FILE, QUARRY_TLS_KEY_FILE and QUARRY_TLS_CA_FILE).",
    )
    tls_server_name: str = _setting(
        "",
        "The name server certificates are verified against when it differs from the host "
        "dialed (gRPC's ssl_target_name_override). Empty: the host of the address.",
    )
    allow_insecure_listen: bool = _setting(
        False,
        "Let a server listen without TLS on a non-loopback address (anything but "
        "127.0.0.0/8, ::1, localhost). Off: such a server refuses to start.",
    )
    log_level: str = _setting(
        "INFO", "Python logging level of the services (DEBUG, INFO, WARNING, ERROR)."
    )
    log_format: str = _setting(
        "text",
        "Log lines of the services: `text` (human-readable) or `json` (one object per line "
        "with time, level, service, logger, message, and the trace_id and span_id of the "
        "traced request it belongs to).",
    )

    def __post_init__(self) -> None:
        self._check_operator_values()
        if self.log_format not in LOG_FORMATS:
            raise errors.InvalidArgument(
                f"setting log_format must be one of {', '.join(LOG_FORMATS)}, "
                f"not {self.log_format!r}"
            )
        for name in (
            "max_put_objects_stream_entries",
            "max_put_objects_stream_bytes",
            "s3_gateway_staging_batch",
        ):
            if getattr(self, name) < 1:
                raise errors.InvalidArgument(
                    f"setting {name} must be positive, not {getattr(self, name)}"
                )
        for name in (
            "range_cache_bytes",
            "metarange_cache_bytes",
            "range_writer_processes",
            "branch_manager_workers",
            "committer_workers",
            "s3_gateway_workers",
            "import_listing_processes",
        ):
            if getattr(self, name) < 0:
                raise errors.InvalidArgument(
                    f"setting {name} must be 0 or more, not {getattr(self, name)}"
                )
        if not self.range_writer_span_timeout_seconds > 0:
            raise errors.InvalidArgument(
                "setting range_writer_span_timeout_seconds must be positive, "
                f"not {self.range_writer_span_timeout_seconds}"
            )
        if not self.staging_drop_grace_seconds > REPOSITORY_CACHE_SECONDS:
            # The dropper may delete a retired token's items only after every reader that
            # could still hold a record naming it is done; a shorter grace loses staged data
            # those readers should see.
            raise errors.InvalidArgument(
                "setting staging_drop_grace_seconds (QUARRY_STAGING_DROP_GRACE_SECONDS) must "
                f"be longer than the repository cache ({REPOSITORY_CACHE_SECONDS:g} s): "
                "retired staging tokens must outlive every cached record that names them, "
                f"not {self.staging_drop_grace_seconds:g}"
            )
        self._check_backoffs()
        if not 0 < self.auth_token_lifetime_seconds <= MAX_TOKEN_LIFETIME_SECONDS:
            raise errors.InvalidArgument(
                f"setting auth_token_lifetime_seconds must be 1..{MAX_TOKEN_LIFETIME_SECONDS}, "
                f"not {self.auth_token_lifetime_seconds}"
            )
        for name in (
            "auth_login_attempts_per_minute_per_key",
            "auth_login_attempts_per_minute_per_address",
            "console_login_attempts_per_minute_per_address",
        ):
            if getattr(self, name) < 1:
                raise errors.InvalidArgument(
                    f"setting {name} must be at least 1, not {getattr(self, name)}"
                )
        if not 0 < self.console_session_seconds <= MAX_TOKEN_LIFETIME_SECONDS:
            raise errors.InvalidArgument(
                f"setting console_session_seconds must be 1..{MAX_TOKEN_LIFETIME_SECONDS}, "
                f"not {self.console_session_seconds}"
            )
        if not self.http_idle_seconds > 0:
            raise errors.InvalidArgument(
                f"setting http_idle_seconds must be above 0, not {self.http_idle_seconds}"
            )
        if self.max_response_bytes < 1:
            raise errors.InvalidArgument(
                f"setting max_response_bytes must be positive, not {self.max_response_bytes}"
            )
        derived = []
        for service in SERVICES:
            attr = _attr(service, "address")
            if not getattr(self, attr):
                object.__setattr__(self, attr, f"{self.dial_host}:{self.port_of(service)}")
                derived.append(attr)
        object.__setattr__(self, "_derived_addresses", frozenset(derived))

    @property
    def dial_host(self) -> str:
        """The host a derived `*_address` dials: the listen host when it names one host."""
        host = self.listen_host.strip()
        if host in _WILDCARD_HOSTS:
            return DEFAULT_DIAL_HOST
        if ":" in host and not host.startswith("["):
            return f"[{host}]"  # an IPv6 literal
        return host

    def address_follows_port(self, service: str) -> bool:
        """True when `service`'s address was not given and so follows its port."""
        # Set by __post_init__ as a plain attribute, not a field: two Settings with the
        # same values are equal however they were given.
        derived: frozenset[str] = vars(self).get("_derived_addresses", frozenset())
        return _attr(service, "address") in derived

    def port_of(self, service: str) -> int:
        port: int = getattr(self, _attr(service, "port"))
        return port

    def address_of(self, service: str) -> str:
        address: str = getattr(self, _attr(service, "address"))
        return address

    def workers_of(self, service: str) -> int:
        """How many worker processes serve `service` (quarry.runtime.workers): its
        `*_workers` setting with 0 resolved to the usable cores, no more than fit the
        container's memory limit (processes_that_fit); 1 for a service without one."""
        configured: int = getattr(self, _attr(service, "workers"), 1)
        if configured > 0:
            return configured
        return min(usable_cores(), processes_that_fit(service, container_memory_limit()))

    def cache_processes_of(self, service: str) -> int:
        """How many processes of `service` keep memory caches of committed data in one
        container (a pod): its worker processes, and the range-writer's span worker
        processes beside it; 0 for a service that keeps none."""
        if service == "range-writer":
            return 1 + max(0, self.range_writer_processes)
        return self.workers_of(service) if service in CACHE_SERVICES else 0

    def caches_fitted(self, memory_limit: int | None, processes: int) -> tuple[Settings, str]:
        """These settings with range_cache_bytes and metarange_cache_bytes scaled down (in
        proportion) so that `processes` processes, each resident at about twice what its
        caches charge plus RESIDENT_BASE_BYTES (measured; README: range_cache_bytes), stay
        within MEMORY_LIMIT_SHARE of the container's memory limit; and why, for the log
        ("" when they fit or there is no limit). The caches are a speed-up: a container
        killed for its memory is an outage, so they shrink rather than the limit being
        left to the kernel's OOM killer."""
        wanted = self.range_cache_bytes + self.metarange_cache_bytes
        if memory_limit is None or wanted <= 0 or processes <= 0:
            return self, ""
        share = memory_limit * MEMORY_LIMIT_SHARE / processes
        allowed = max(0, int((share - RESIDENT_BASE_BYTES) / CACHE_RESIDENT_FACTOR))
        if wanted <= allowed:
            return self, ""
        fitted = dataclasses.replace(
            self,
            range_cache_bytes=self.range_cache_bytes * allowed // wanted,
            metarange_cache_bytes=self.metarange_cache_bytes * allowed // wanted,
        )
        reason = (
            f"the memory caches (QUARRY_RANGE_CACHE_BYTES {_mib(self.range_cache_bytes)} + "
            f"QUARRY_METARANGE_CACHE_BYTES {_mib(self.metarange_cache_bytes)} per process, "
            f"{processes} process(es)) do not fit the container's memory limit of "
            f"{_mib(memory_limit)}: using {_mib(fitted.range_cache_bytes)} + "
            f"{_mib(fitted.metarange_cache_bytes)} per process; raise the memory limit (or "
            "lower the worker count) for larger caches"
        )
        if share < RESIDENT_BASE_BYTES:
            reason += (
                f". The {processes} processes alone need about "
                f"{_mib(processes * RESIDENT_BASE_BYTES)} without caches: lower the worker "
                "count, or the container will be killed for its memory"
            )
        return fitted, reason

    def metrics_port_of(self, service: str) -> int:
        if self.metrics_base_port <= 0:
            return 0
        return self.metrics_base_port + SERVICES.index(service)

    def _check_operator_values(self) -> None:
        """Values an operator sets that would otherwise turn into something else (a port
        wrapped modulo 65536, a negative retention) or fail later with a traceback: refused
        at start, naming the QUARRY_* variable."""

        def refuse(name: str, rule: str) -> None:
            raise errors.InvalidArgument(
                f"setting {ENV_PREFIX}{name.upper()} {rule}, not {getattr(self, name)!r}",
                metadata={"setting": ENV_PREFIX + name.upper()},
            )

        for service in SERVICES:
            name = _attr(service, "port")
            if not 0 <= getattr(self, name) <= 65535:
                refuse(name, "must be a TCP port, 0-65535")
        if not 0 <= self.metrics_base_port <= 65535 - (len(SERVICES) - 1):
            refuse(
                "metrics_base_port",
                f"must be 0 (off) or a port that leaves room for {len(SERVICES)} services "
                f"(1-{65535 - (len(SERVICES) - 1)})",
            )
        if self.max_workers < 1:
            refuse("max_workers", "must be at least 1")
        if not self.request_retention_seconds > 0:
            refuse("request_retention_seconds", "must be above 0")
        if not 0 <= self.shutdown_grace_seconds <= 3600:
            refuse("shutdown_grace_seconds", "must be 0-3600 seconds")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            refuse("log_level", "must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        for prefix in self.import_local_prefixes.split(","):
            if prefix.strip() and not prefix.strip().startswith("/"):
                refuse("import_local_prefixes", "must be absolute directories, comma-separated")
        for service in SERVICES:
            name = _attr(service, "address")
            problem = address_problem(getattr(self, name)) if getattr(self, name) else None
            if problem:
                refuse(name, problem)

    def _check_backoffs(self) -> None:
        """Retry limits that could not work: no attempt at all, or a backoff that is not
        positive or starts above its cap."""
        for name, least in (
            ("branch_retry_attempts", 1),
            ("merge_retry_attempts", 1),
            ("kv_throttle_retries", 0),
        ):
            if getattr(self, name) < least:
                raise errors.InvalidArgument(
                    f"setting {name} must be at least {least}, not {getattr(self, name)}"
                )
        for base, cap in (
            ("branch_retry_base_seconds", "branch_retry_cap_seconds"),
            ("kv_throttle_backoff_base_seconds", "kv_throttle_backoff_cap_seconds"),
        ):
            if not 0 < getattr(self, base) <= getattr(self, cap):
                raise errors.InvalidArgument(
                    f"settings {base} and {cap} must be positive, the base at most the cap, "
                    f"not {getattr(self, base):g} and {getattr(self, cap):g}"
                )

    @property
    def effective_kv_url(self) -> str:
        return self.kv_url or f"sqlite:///{Path(self.home).resolve() / 'kv.db'}"

    @property
    def effective_signing_key_file(self) -> str:
        return self.auth_signing_key_file or str(Path(self.home).resolve() / "signing.key")

    @property
    def effective_console_session_key_file(self) -> str:
        return self.console_session_key_file or str(
            Path(self.home).resolve() / "console-session.key"
        )

    @property
    def effective_cache_dir(self) -> str:
        return self.cache_dir or str(Path(self.home).resolve() / "cache")

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`; an address that followed its port keeps following it (so
        `replace(kv_gateway_port=p)` moves the dialled address too)."""
        for service in SERVICES:
            attr = _attr(service, "address")
            if attr not in changes and self.address_follows_port(service):
                changes[attr] = ""
        return dataclasses.replace(self, **changes)


def port_taken(service: str, host: str, port: int) -> errors.Unavailable:
    """The error of a service that cannot listen on its port (another process has it): one
    line naming the setting that moves it, never a traceback."""
    return errors.Unavailable(
        f"{service} cannot listen on {host}:{port} (address in use?); choose another with "
        f"QUARRY_{_upper(service)}_PORT",
        metadata={"address": f"{host}:{port}"},
    )


def usable_cores() -> int:
    """The CPU cores this process may use: its CPU affinity, lowered by a cgroup v2 CPU
    limit (a container's `resources.limits.cpu`, rounded up) when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit readable: the affinity stands
    return cores


# A process's resident memory settles at about CACHE_RESIDENT_FACTOR × what its memory
# caches charge plus RESIDENT_BASE_BYTES (measured with the default sizes: ~810 MB; README,
# range_cache_bytes). Settings.caches_fitted keeps the processes of a container within
# MEMORY_LIMIT_SHARE of its limit: the rest is for a commit's or an import's working memory.
CACHE_SERVICES = ("branch-manager", "committer", "range-writer")
CACHE_RESIDENT_FACTOR = 2
RESIDENT_BASE_BYTES = 150 * 1024 * 1024
MEMORY_LIMIT_SHARE = 0.75
# The smallest caches (range + metarange, charged) a worker counted "one per core" is given
# room for: fewer workers with useful caches rather than many reading every range from disk.
MIN_FITTED_CACHE_BYTES = 32 * 1024 * 1024
# cgroup v2's memory.max, then cgroup v1's limit (which reads as about 2**63 when unlimited).
MEMORY_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
UNLIMITED_MEMORY_BYTES = 1 << 60


def container_memory_limit(files: tuple[str, ...] = MEMORY_LIMIT_FILES) -> int | None:
    """The memory limit of this process's container (cgroup v2, else v1: a pod's
    `resources.limits.memory`, `podman run --memory`), or None when there is none."""
    for name in files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue  # not this cgroup version
        if text == "max":
            return None
        try:
            limit = int(text)
        except ValueError:
            return None
        return limit if 0 < limit < UNLIMITED_MEMORY_BYTES else None
    return None


def processes_that_fit(service: str, memory_limit: int | None) -> int:
    """How many processes of `service` fit MEMORY_LIMIT_SHARE of a container's memory
    limit, each with the base resident memory and, for a service that keeps caches, caches
    of at least MIN_FITTED_CACHE_BYTES (at least 1; unbounded without a limit): the bound on
    a worker count of 0 ("one per core"), which on a large node would otherwise start more
    processes than the pod's memory holds."""
    if memory_limit is None:
        return 1 << 30
    need = RESIDENT_BASE_BYTES
    if service in CACHE_SERVICES:
        need += CACHE_RESIDENT_FACTOR * MIN_FITTED_CACHE_BYTES
    return max(1, int(memory_limit * MEMORY_LIMIT_SHARE // need))


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.0f} MiB"


def setting_given(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether setting `name` is given explicitly (QUARRY_<NAME> or the TOML file), not left
    at its default: `quarry up` then keeps it instead of applying its own default."""
    env = os.environ if env is None else env
    if ENV_PREFIX + name.upper() in env:
        return True
    config_file = env.get(CONFIG_FILE_ENV)
    if not config_file:
        return False
    with open(config_file, "rb") as fh:
        return name in tomllib.load(fh)


def _attr(service: str, suffix: str) -> str:
    if service not in SERVICES:
        raise errors.InvalidArgument(f"unknown service {service!r}; known: {', '.join(SERVICES)}")
    return f"{service.replace('-', '_')}_{suffix}"


class SettingInfo(NamedTuple):
    """One setting as documented: read from its field, never from source text."""

    name: str
    env: str
    type: type
    default: str
    description: str


def describe_settings() -> list[SettingInfo]:
    """Every setting, in declaration order, from the fields' annotations and metadata."""
    hints = typing.get_type_hints(Settings)
    rows = []
    for f in dataclasses.fields(Settings):
        shown = f.metadata.get("shown_default")
        rows.append(
            SettingInfo(
                name=f.name,
                env=ENV_PREFIX + f.name.upper(),
                type=hints[f.name],
                default=shown if shown is not None else _display(f.default),
                description=f.metadata.get("description", ""),
            )
        )
    return rows


def settings_table() -> list[tuple[str, str, str]]:
    """(environment variable, default, description) for every setting, in declaration order."""
    return [(info.env, info.default, info.description) for info in describe_settings()]


def settings_markdown() -> str:
    """The README's settings table (between its `settings:begin` / `settings:end` marks)."""
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{i.env}` | {i.type.__name__} | `{i.default}` | {i.description} |"
        for i in describe_settings()
    ]
    return "\n".join(lines) + "\n"


def settings_text() -> str:
    """`quarry settings`: one line per setting."""
    return "".join(f"{i.env:<42} {i.default:<18} {i.description}\n" for i in describe_settings())


def _display(default: Any) -> str:
    if isinstance(default, bool):
        return "true" if default else "false"
    if default == "":
        return "(empty)"
    return str(default)


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
            f"setting {name}: {raw!r} is not a valid {kind.__name__}"
        ) from None


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Defaults → TOML file → QUARRY_* environment → explicit overrides (for tests)."""
    env = os.environ if env is None else env
    kinds = {info.name: info.type for info in describe_settings()}
    values: dict[str, Any] = {}

    config_file = env.get(CONFIG_FILE_ENV)
    if config_file:
        with open(config_file, "rb") as fh:
            try:
                loaded = tomllib.load(fh)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise errors.InvalidArgument(f"{config_file}: not valid TOML: {exc}") from None
            for name, raw in loaded.items():
                if name not in kinds:
                    raise errors.InvalidArgument(f"{config_file}: unknown setting {name!r}")
                values[name] = _coerce(name, raw, kinds[name])

    for name, kind in kinds.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(ENV_PREFIX + name.upper(), raw, kind)

    for name, raw in overrides.items():
        if name not in kinds:
            raise errors.InvalidArgument(f"unknown setting {name!r}")
        values[name] = raw
    return Settings(**values)
