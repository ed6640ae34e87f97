"""quarry.client.Client: the BranchManager and Committer APIs with retries and domain errors.

    from quarry.client import Client, RetryPolicy
    from quarry import errors

    with Client("127.0.0.1:7402", "127.0.0.1:7403") as client:
        client.create_repository("lake", "/data/lake")
        client.put_object("lake", "main", path="a.csv", physical_address="/data/a.csv",
                          size_bytes=10, checksum="...")
        outcome = client.commit("lake", "main", "first")
        for entry in client.iter_objects("lake", "main", prefix="a"):
            ...

The client is thin: one method per RPC, returning the protobuf messages of
quarry.v1 (the resource inside the response when the response holds just one, e.g.
`get_branch -> types_pb2.Branch`; the whole response when it carries more, e.g.
`commit -> CommitResponse(commit, summary)`, `list_objects -> ListObjectsResponse`).
`iter_*` helpers follow page tokens. Failures raise the QuarryError rebuilt from the
status (quarry.errors.NotFound and its subclasses such as BranchNotFound, etc.; the
reason is `exc.reason`). Calls failing with ABORTED or UNAVAILABLE, or with a
RESOURCE_EXHAUSTED that carries RetryInfo (throttling), are retried under the client's
RetryPolicy; any other RESOURCE_EXHAUSTED (e.g. MESSAGE_TOO_LARGE) fails at once.

Retries are idempotent: every mutating call except the staging writes (put_object(s),
delete_object(s)) carries a request_id (AIP-155), a fresh uuid4 per logical call kept
across its retries, so a Commit or Merge whose answer was lost is answered by the server
with the first result instead of running again. Pass `request_id=` to choose it (e.g. a
stable id derived from a job id, so a restarted driver gets the same answer), or "" for
none. Staging writes carry one only when asked (`request_id=`): they are idempotent by
entry identity already (an id only matters when another writer re-points the same path
between a lost answer and its retry), and an id costs two more conditional KV writes per
call: measured over loopback, a PutObject goes from 1 KV write to 3 and ~1.7x the latency;
a 1,000-entry PutObjects message +2 writes (+0.2 %) but ~1.3x the latency (the fingerprint
and two gateway round trips) — too much for the bulk path to pay by default. The records
also land in the repository's partition, not the staging one: ids on every staging write
would cap a repository at ~500 such calls/s under DynamoDB's 1,000 WCU/s per partition.

Authentication: with `credentials=` (quarry.client.Credentials), or with neither
credentials nor `token=` given, those load_credentials() finds (QUARRY_ACCESS_KEY_ID +
QUARRY_SECRET_ACCESS_KEY, else $QUARRY_HOME/credentials.json), the client logs in
(Auth/Login on the branch-manager) before its first call and sends
`authorization: Bearer <token>` on every call of every channel it opens, renewing the token
before it expires (quarry.client.session). With none at all it sends no header: a server
with auth on answers UNAUTHENTICATED, one with auth off as before. With `token_cache=` (quarry.client.token_cache.TokenCache; the CLI
passes its QUARRY_HOME's) the token is kept between processes: one Login per token
lifetime instead of one per process.

Transport: channels opened on addresses use TLS as `security=` says
(quarry.runtime.tls.ChannelSecurity; `Client.from_settings` passes the settings'), else as
the environment's QUARRY_TLS_* settings say (plaintext when none is set). A failed TLS
handshake is UNAVAILABLE / TLS_HANDSHAKE_FAILED and not retried (docs/tls.md).

A Client is thread-safe (gRPC channels are); close it, or use it as a context manager.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from quarry import errors
from quarry.client.auth import AuthCalls
from quarry.client.branch_manager import BranchManagerCalls
from quarry.client.calls import IncompleteListing
from quarry.client.committer import CommitterCalls
from quarry.client.credentials import Credentials, load_credentials
from quarry.client.entries import (
    Entry,
    as_entry,
    batch_request_id,
    make_entry,
    new_request_id,
    to_timestamp,
)
from quarry.client.retry import RetryPolicy
from quarry.client.session import BearerTokenInterceptor, TokenSource, TokenStub, login_over
from quarry.client.token_cache import TokenCache

# Client dials through this name (tests reach it as quarry.client.client.open_channel).
from quarry.runtime.channels import open_channel
from quarry.runtime.errors import domain_errors, from_rpc_error
from quarry.runtime.tls import ChannelSecurity, channel_security
from quarry.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    branch_manager_pb2,
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    compactor_sensor_pb2_grpc,
    server_info_pb2,
    server_info_pb2_grpc,
)
from quarry.v1 import compactor_sensor_pb2 as cs

DeadlineExceeded = errors.DeadlineExceeded
Cancelled = errors.Cancelled


def rebuild_error(error: grpc.RpcError) -> errors.QuarryError:
    """The domain exception a call failed with (quarry.runtime.errors.from_rpc_error)."""
    return from_rpc_error(error)


# ---- the client -------------------------------------------------------------------------


# branch_staging_stats(quick=True): its one attempt's deadline.
QUICK_STATS_SECONDS = 2.0


class Client(BranchManagerCalls, CommitterCalls, AuthCalls):
    """A client of the BranchManager and Committer services (see the module docstring),
    and of the CompactorSensor's statistics (`compactor_sensor`, dialed on first use).

    Safety: the sensor is dialed only at the address given (from_settings gives
    `settings.compactor_sensor_address`), never at a guessed default port: every call
    carries the caller's token, and a default would send it to whatever listens there
    (the console once did, for every signed-in user).

    The calls live by service: quarry.client.branch_manager, quarry.client.committer (over
    quarry.client.calls); this class dials the channels and adds ServerInfo and the
    CompactorSensor, and authenticates every call (module docstring)."""

    def __init__(  # noqa: PLR0913 — public keyword options (addresses, timeout, credentials or token)
        self,
        branch_manager: str | grpc.Channel = "127.0.0.1:7402",
        committer: str | grpc.Channel = "127.0.0.1:7403",
        retry: RetryPolicy | None = None,
        timeout: float | None = 30.0,
        compactor_sensor: str | grpc.Channel | None = None,
        allow_incomplete_listings: bool = False,
        credentials: Credentials | None = None,
        token: str | None = None,
        security: ChannelSecurity | None = None,
        token_cache: TokenCache | None = None,
        relayed_by: Callable[[], str] | None = None,
    ) -> None:
        self.retry = retry if retry is not None else RetryPolicy()
        # A Quarry service's own token source when it relays a user's writes (the S3
        # gateway, the console): sent with each staging call (RpcCalls._relay_metadata).
        self._relayed_by = relayed_by
        self.timeout = timeout
        # The iter_* helpers refuse a page the server left corrupt records out of
        # (IncompleteListing), unless this is set: code that decides from a listing what
        # is unreferenced (GC) or what a table holds (Spark) must never act on one. The CLI
        # sets it and warns instead.
        self.allow_incomplete_listings = allow_incomplete_listings
        # Corrupt records the server left out of the pages this client walked (see _pages).
        self.skipped_corrupt_records = 0
        self._owned: list[grpc.Channel] = []
        plain: dict[str, grpc.Channel] = {}

        def plain_channel(target: str | grpc.Channel) -> grpc.Channel:
            if not isinstance(target, str):
                return target
            if target not in plain:
                plain[target] = open_channel(target, security=security)
                self._owned.append(plain[target])
            return plain[target]

        if credentials is None and token is None:
            credentials = load_credentials()
        bm_plain = plain_channel(branch_manager)
        # Login (open) goes over the plain channel; every other call through the interceptor.
        source = TokenSource(
            login_over(bm_plain, timeout),
            credentials,
            token,
            cache=token_cache,
            endpoint=branch_manager if isinstance(branch_manager, str) else "",
        )
        self._token_source: TokenSource | None = source if source.active else None
        interceptor = BearerTokenInterceptor(source) if source.active else None
        intercepted: dict[int, grpc.Channel] = {}

        def channel(target: str | grpc.Channel) -> grpc.Channel:
            raw = plain_channel(target)
            if interceptor is None:
                return raw
            if id(raw) not in intercepted:
                intercepted[id(raw)] = grpc.intercept_channel(raw, interceptor)
            return intercepted[id(raw)]

        self.branch_manager_target = branch_manager if isinstance(branch_manager, str) else ""
        self.committer_target = committer if isinstance(committer, str) else ""
        self._bm_channel = channel(branch_manager)
        self._auth_open = auth_pb2_grpc.AuthStub(bm_plain)
        self._cm_channel = channel(committer)
        cm_plain = plain_channel(committer)

        def stub(kind: Any, module: Any, name: str, plain: grpc.Channel) -> Any:
            # Unary calls carry the token as call metadata (TokenStub: no interceptor on
            # the hot path); streams go through the interceptor.
            intercepted = channel(plain)
            if not source.active:
                return kind(intercepted)
            service = module.DESCRIPTOR.services_by_name[name]
            return TokenStub(source, service, kind(plain), kind(intercepted))

        self._auth = stub(auth_pb2_grpc.AuthStub, auth_pb2, "Auth", bm_plain)
        self._bm = stub(
            branch_manager_pb2_grpc.BranchManagerStub, branch_manager_pb2, "BranchManager", bm_plain
        )
        self._cm = stub(committer_pb2_grpc.CommitterStub, committer_pb2, "Committer", cm_plain)
        self.compactor_sensor_target = compactor_sensor if isinstance(compactor_sensor, str) else ""
        self._cs_target = compactor_sensor
        self._cs_channel_factory = channel
        self._channel_for = channel
        self._cs_stub: compactor_sensor_pb2_grpc.CompactorSensorStub | None = None
        self._cs_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> Client:
        """Dial `settings.branch_manager_address`, `settings.committer_address` (and
        `settings.compactor_sensor_address` when sensor statistics are asked for), secured as
        `settings` say (QUARRY_TLS_*)."""
        kwargs.setdefault("compactor_sensor", settings.compactor_sensor_address)
        kwargs.setdefault("security", channel_security(settings))
        return cls(
            branch_manager=settings.branch_manager_address,
            committer=settings.committer_address,
            **kwargs,
        )

    def close(self) -> None:
        for channel in self._owned:
            channel.close()
        self._owned.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def authenticated_channel(self, target: str) -> grpc.Channel:
        """A channel to another Quarry service (e.g. the kv-gateway for `quarry doctor`)
        whose calls carry this client's token; closed with the client."""
        return self._channel_for(target)

    def server_info(self, service: str = "branch-manager") -> server_info_pb2.GetServerInfoResponse:
        """GetServerInfo of the branch-manager or the committer."""
        channel = self._cm_channel if service == "committer" else self._bm_channel
        stub = server_info_pb2_grpc.ServerInfoStub(channel)
        return self._unary(
            stub.GetServerInfo, "ServerInfo/GetServerInfo", server_info_pb2.GetServerInfoRequest()
        )

    # ==== CompactorSensor ==================================================================

    @property
    def _cs(self) -> compactor_sensor_pb2_grpc.CompactorSensorStub:
        if self._cs_target is None:
            raise ValueError(
                "this client was given no compactor-sensor address (compactor_sensor=)"
            )
        with self._cs_lock:
            if self._cs_stub is None:
                self._cs_stub = compactor_sensor_pb2_grpc.CompactorSensorStub(
                    self._cs_channel_factory(self._cs_target)
                )
            return self._cs_stub

    def branch_staging_stats(
        self, repository: str, branch: str, *, quick: bool = False
    ) -> cs.GetBranchStagingStatsResponse:
        """The sensor's view of a branch: staged `.puts`, `.deletes` (tombstones),
        `.sealed_tokens` and `.last_compaction` (start time; unset if never). `quick`: one
        attempt within QUICK_STATS_SECONDS (a page showing them beside other things must
        not wait out the retries of a sensor that is down)."""
        request = cs.GetBranchStagingStatsRequest(repository=repository, branch=branch)
        if quick:
            with domain_errors():
                return self._cs.GetBranchStagingStats(request, timeout=QUICK_STATS_SECONDS)
        return self._unary(
            self._cs.GetBranchStagingStats, "CompactorSensor/GetBranchStagingStats", request
        )

    def compaction_candidates(self, page_size: int = 0) -> list[cs.CompactionCandidate]:
        """Branches past a compaction threshold, with the threshold crossed (`.reason`)."""
        return list(
            self._unary(
                self._cs.ListCompactionCandidates,
                "CompactorSensor/ListCompactionCandidates",
                cs.ListCompactionCandidatesRequest(page_size=page_size),
            ).candidates
        )


__all__ = [
    "Client",
    "RetryPolicy",
    "DeadlineExceeded",
    "Cancelled",
    "make_entry",
    "as_entry",
    "to_timestamp",
    "rebuild_error",
    "Entry",
    "IncompleteListing",
    "new_request_id",
    "batch_request_id",
]
