"""Property: every public RPC, called with arbitrary field values against the real suite on
loopback, (1) never answers INTERNAL or UNKNOWN — a user's mistake gets a clear status — and
(2) when it answers an error, changed nothing the user can observe (repositories, branches
and their commits, tags, the listing of main and of a branch including uncommitted changes,
the log).

Requests come from tests/support/proto_fuzz.py, built from the proto descriptors, so an RPC
or field added later is fuzzed without new code here; `test_every_public_rpc_is_covered`
fails when a public RPC is missing from the run. The suite is started once for the module;
after a call that succeeded (it may have deleted or moved things) the fixture repository is
put back into shape, so later examples still reach deep code paths.

No known bug is tolerated any more (the last flag, KNOWN_BUG_PUTOBJECTS_PARTIAL_APPLY, went
with the all-or-nothing PutObjects); only QUARRY_PROPTEST_DISCOVER=1 records instead of failing.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from quarry.auth.request_ids import ID_ALIASES
from quarry.graveler.refs import RefManager
from support.processes import free_port
from support.proto_fuzz import (
    KV_SERVICE,
    Pools,
    call,
    public_methods,
    request_strategy,
    rpcs_declared_in_protos,
)
from support.reporting import report_lines
from support.suite import running_suite

# QUARRY_PROPTEST_DISCOVER=1: record forbidden codes instead of failing (to survey a branch).
DISCOVER = os.environ.get("QUARRY_PROPTEST_DISCOVER") == "1"

# Examples per RPC: mutating RPCs get more. Fixed, derandomized, no example database, so a
# CI run is the same run every time.
EXAMPLES_READ = 10
EXAMPLES_MUTATE = 20
# Every RPC whose name does not say it only reads is treated as mutating (a new RPC too).
READ_ONLY_PREFIXES = ("Get", "List", "Stat", "Diff", "Log", "Find", "Scan", "BatchGet")


# The examples' seed, pinned: derandomize alone seeds from the text of the test function,
# so any edit of it drew other examples for every RPC. This is the seed that text gave
# (the examples this module has run since); change it only on purpose.
EXAMPLES_SEED = int(
    "29798552046421438678927092741675084349455094569993999472916441247657768235422828292669823"
    "307531178016542010479950060"
)


def is_mutating(rpc_name: str) -> bool:
    return not rpc_name.startswith(READ_ONLY_PREFIXES)


# Codes that say "this server is broken", not "your request was wrong". DEADLINE_EXCEEDED
# and UNAVAILABLE on loopback to a running server mean a hang or a crash, just as bad.
FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
}

REPO, OTHER = "demo", "other"
SERVICE_TARGET = {
    "Auth": "branch-manager",
    "BranchManager": "branch-manager",
    "Committer": "committer",
    "CompactorSensor": "compactor-sensor",
    "KVGateway": "kv-gateway",
    "ServerInfo": "branch-manager",
}
METHODS = {f"{m.containing_service.name}/{m.name}": m for m in public_methods()}


@dataclass
class World:
    suite: object
    channels: dict
    pools: Pools
    scratch_counter: itertools.count
    examples: Counter
    tolerated: Counter
    codes: dict
    # The last snapshot, while no call has been made since it was taken (see snapshot):
    # a failed example's "after" is the next example's "before".
    last_snapshot: dict | None = None
    # The staging tokens of demo's branches as that snapshot saw them (for the pools; not
    # compared: a token is not something the property is about).
    staging_tokens: list[str] = field(default_factory=list)

    def scratch(self, stem: str) -> str:
        return str(self.suite.home / "lake" / f"fuzz-{stem}-{next(self.scratch_counter)}")

    def channel(self, service: str) -> grpc.Channel:
        """The channel every call of this module is made on: a call may change the state,
        so the last snapshot no longer stands."""
        self.last_snapshot = None
        return self.channels[SERVICE_TARGET[service]]


def _bm(world, name, request):
    return call(world.channel("BranchManager"), METHODS[f"BranchManager/{name}"], request)


def _cm(world, name, request):
    return call(world.channel("Committer"), METHODS[f"Committer/{name}"], request)


def _input(name: str):
    from support.proto_fuzz import message_class

    return message_class(METHODS[name].input_type)


def _entry(path: str, address: str, size: int, checksum: str = ""):
    from quarry.v1 import types_pb2

    return types_pb2.Entry(path=path, physical_address=address, size_bytes=size, checksum=checksum)


def error_info(exc: grpc.RpcError):
    """The google.rpc.ErrorInfo of a failed call, None when it has none."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    try:
        status = rpc_status.from_call(exc)
    except ValueError:  # the status details disagree with the call's code: unreadable
        return None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def _code(exc: grpc.RpcError) -> grpc.StatusCode:
    return exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN


def ensure_fixture(world: World, iam: bool = True) -> None:
    """Bring repository `demo` back to: main with two commits (a/1, a/2, b/c.csv), branch dev
    off main with staged changes, tag v1; repository `other` exists; with `iam`, the IAM ids
    of the pools exist. Then refresh the pools from what exists.

    Cheap when all is in place: one read of dev's staged changes and the snapshot, which the
    next example takes as its "before" anyway (and whose lists say whether the repositories,
    main's commits, dev and v1 are there); only when something is missing the reads and
    creates of restore_fixture run."""
    if iam:
        ensure_iam_fixture(world)
    if not _fixture_in_shape(world):
        restore_fixture(world)
    # Pools: what exists now, so the next example can name it.
    seen = snapshot(world)
    assert isinstance(seen["log"], list), f"the fixture is not restored: {seen}"
    world.pools.commit_ids[:] = seen["log"][:5]
    world.pools.branches[:] = sorted({name for name, _ in seen["branches"]} | {"main", "dev"})
    world.pools.staging_tokens[:] = list(world.staging_tokens)


def _fixture_in_shape(world: World) -> bool:
    """Everything restore_fixture would create is there (nothing for it to do)."""
    try:
        staged = _bm(
            world,
            "DiffUncommitted",
            _input("BranchManager/DiffUncommitted")(repository=REPO, branch="dev", page_size=1),
        )
    except grpc.RpcError as exc:
        if _code(exc) == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    seen = snapshot(world)  # taken after the read above, so the next example reuses it
    if any(isinstance(seen[k], str) for k in ("repositories", "branches", "tags", "log")):
        return False  # an observation failed ("error NOT_FOUND"): something is missing
    return (
        bool(staged.changes)
        and {REPO, OTHER} <= {name for name, _ in seen["repositories"]}
        and len(seen["log"]) >= 3  # the repository's first commit + two of ours
        and "dev" in {name for name, _ in seen["branches"]}
        and "v1" in {name for name, _ in seen["tags"]}
    )


def restore_fixture(world: World) -> None:
    """Create what is missing of the fixture repositories (see ensure_fixture)."""
    bm = "BranchManager/"

    def exists(rpc, **fields) -> bool:
        try:
            _bm(world, rpc, _input(bm + rpc)(**fields))
            return True
        except grpc.RpcError as exc:
            if _code(exc) == grpc.StatusCode.NOT_FOUND:
                return False
            raise

    for name in (REPO, OTHER):
        if not exists("GetRepository", name=name):
            _bm(
                world,
                "CreateRepository",
                _input(bm + "CreateRepository")(
                    name=name, storage_namespace=world.scratch(name), default_branch="main"
                ),
            )
            if name == REPO:
                # Services cache a repository record for RefManager.REPOSITORY_TTL_SECONDS;
                # until it expires the committer still sees the deleted instance.
                time.sleep(RefManager.REPOSITORY_TTL_SECONDS + 0.2)
    main = _bm(world, "GetBranch", _input(bm + "GetBranch")(repository=REPO, name="main")).branch
    log = _cm(world, "Log", _input("Committer/Log")(repository=REPO, ref="main", page_size=5))
    if len(log.commits) < 3:  # the repository's first commit + two of ours
        for i, paths in enumerate((["a/1.parquet", "a/2.parquet"], ["b/c.csv"])):
            _bm(
                world,
                "PutObjects",
                [
                    _input(bm + "PutObjects")(
                        repository=REPO,
                        branch="main",
                        entries=[_entry(p, f"s3://bucket/{p}.{i}", 10 + i, f"c{i}") for p in paths],
                    )
                ],
            )
            _cm(
                world,
                "Commit",
                _input("Committer/Commit")(
                    repository=REPO, branch="main", message=f"fixture {i}", allow_empty=True
                ),
            )
        main = _bm(
            world, "GetBranch", _input(bm + "GetBranch")(repository=REPO, name="main")
        ).branch
    if not exists("GetBranch", repository=REPO, name="dev"):
        _bm(
            world,
            "CreateBranch",
            _input(bm + "CreateBranch")(repository=REPO, name="dev", source_ref="main"),
        )
    staged = _bm(
        world,
        "DiffUncommitted",
        _input(bm + "DiffUncommitted")(repository=REPO, branch="dev", page_size=1),
    )
    if not staged.changes:
        _bm(
            world,
            "PutObject",
            _input(bm + "PutObject")(
                repository=REPO,
                branch="dev",
                entry=_entry("a/1.parquet", "s3://bucket/dev-a1", 11, "d1"),
            ),
        )
        _bm(
            world,
            "PutObject",
            _input(bm + "PutObject")(
                repository=REPO, branch="dev", entry=_entry("x/new.parquet", "s3://bucket/x", 5)
            ),
        )
    if not exists("GetTag", repository=REPO, name="v1"):
        _bm(
            world,
            "CreateTag",
            _input(bm + "CreateTag")(repository=REPO, name="v1", ref=main.commit_id),
        )


def ensure_iam_fixture(world: World) -> None:
    """The IAM ids of the pools exist (a fuzzed DeleteUser/Group/Policy may have removed
    them): one create each, ALREADY_EXISTS when nothing is missing."""
    creates = [("CreateUser", {"user_id": u}) for u in world.pools.iam_users] + [
        ("CreateGroup", {"group_id": g}) for g in world.pools.iam_groups
    ]
    creates += [
        (
            "CreatePolicy",
            {
                "policy_id": p,
                "document": '{"Statement":[{"Effect":"Allow","Action":"fs:ReadObject",'
                '"Resource":"*"}]}',
            },
        )
        for p in world.pools.iam_policies
    ]
    for rpc, fields in creates:
        name = f"Auth/{rpc}"
        try:
            call(world.channel("Auth"), METHODS[name], _input(name)(**fields))
        except grpc.RpcError as exc:
            if _code(exc) != grpc.StatusCode.ALREADY_EXISTS:
                raise


def snapshot(world: World) -> dict:
    """What a user can observe: repositories, branches and heads, tags, listings of main and
    dev (dev including uncommitted changes), main's log, and other's branches. Taken again
    only after a call (World.channel) other than a read that succeeded: nothing else changes
    what a user observes (the background loops compact and drop, which keeps every listing
    as it was), so one snapshot per example serves as the example's "after" and the next
    one's "before"."""
    if world.last_snapshot is not None:
        return dict(world.last_snapshot)
    observed = _observe(world)
    world.last_snapshot = observed
    return dict(observed)


def _observe(world: World) -> dict:
    bm = "BranchManager/"

    def attempt(rpc_call):
        try:
            return rpc_call()
        except grpc.RpcError as exc:
            return f"error {_code(exc).name}"

    def entries(ref):
        reply = _bm(
            world,
            "ListObjects",
            _input(bm + "ListObjects")(repository=REPO, ref=ref, page_size=1000),
        )
        return [
            (
                e.path,
                e.physical_address,
                e.size_bytes,
                e.checksum,
                e.content_type,
                sorted(e.metadata.items()),
            )
            for e in reply.entries
        ]

    def branches():
        listed = _bm(
            world, "ListBranches", _input(bm + "ListBranches")(repository=REPO, page_size=1000)
        ).branches
        world.staging_tokens = [b.staging_token for b in listed]
        return sorted((b.name, b.commit_id) for b in listed)

    return {
        "repositories": attempt(
            lambda: sorted(
                (r.name, r.storage_namespace)
                for r in _bm(
                    world, "ListRepositories", _input(bm + "ListRepositories")(page_size=1000)
                ).repositories
            )
        ),
        "branches": attempt(branches),
        "other_branches": attempt(
            lambda: sorted(
                (b.name, b.commit_id)
                for b in _bm(
                    world,
                    "ListBranches",
                    _input(bm + "ListBranches")(repository=OTHER, page_size=1000),
                ).branches
            )
        ),
        "tags": attempt(
            lambda: sorted(
                (t.name, t.commit_id)
                for t in _bm(
                    world, "ListTags", _input(bm + "ListTags")(repository=REPO, page_size=1000)
                ).tags
            )
        ),
        "main": attempt(lambda: entries("main")),
        "dev": attempt(lambda: entries("dev")),
        "log": attempt(
            lambda: [
                c.id
                for c in _cm(
                    world,
                    "Log",
                    _input("Committer/Log")(repository=REPO, ref="main", page_size=1000),
                ).commits
            ]
        ),
        "gc_rules": attempt(
            lambda: str(
                _bm(
                    world,
                    "GetGarbageCollectionRules",
                    _input(bm + "GetGarbageCollectionRules")(repository=REPO),
                )
            )
        ),
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory, request):
    home = tmp_path_factory.mktemp("proptest")
    # An S3 endpoint nobody listens on: s3:// namespaces fail fast and never leave the host.
    dead_s3 = f"http://127.0.0.1:{free_port()}"
    with running_suite(
        home, compactor_sensor=True, s3_endpoint_url=dead_s3, staging_drop_grace_seconds=3.0
    ) as suite:
        channels = {name: grpc.insecure_channel(target) for name, target in suite.targets.items()}
        w = World(
            suite=suite,
            channels=channels,
            pools=Pools(namespaces=[]),
            scratch_counter=itertools.count(),
            examples=Counter(),
            tolerated=Counter(),
            codes={},
        )
        w.pools.namespaces.append(str(home / "lake" / "demo-ns"))
        ensure_fixture(w)
        yield w
        report_lines(request.config, summary_lines(w))
        for channel in channels.values():
            channel.close()


def summary_lines(w: World) -> list[str]:
    total = sum(w.examples.values())
    lines = [f"property tests: {total} examples over {len(w.examples)} RPCs"]
    for name in sorted(w.examples):
        codes = ", ".join(f"{c}={n}" for c, n in sorted(w.codes.get(name, {}).items()))
        lines.append(f"  {name}: {w.examples[name]} examples ({codes})")
    for what, n in sorted(w.tolerated.items()):
        lines.append(f"  TOLERATED {what}: {n} times")
    return lines


@pytest.mark.parametrize("method_name", sorted(METHODS))
def test_rpc_never_internal_and_errors_change_nothing(world, method_name):
    method = METHODS[method_name]
    service = method.containing_service.name
    checks_state = service != KV_SERVICE
    max_examples = EXAMPLES_MUTATE if is_mutating(method.name) else EXAMPLES_READ

    strategy = request_strategy(method, world.pools, world.scratch)
    # A request naming its IAM id by `id` and/or its older name: how it named it, and the
    # codes each way got (every way must be drawn and reach the servicer; see below).
    alias = ID_ALIASES.get(method.input_type.full_name)
    id_outcomes: set[tuple[str, str]] = set()

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @seed(EXAMPLES_SEED)
    @given(data=st.data())
    def run(data):
        request = data.draw(strategy, label="request")
        before = snapshot(world) if checks_state else None
        world.examples[method_name] += 1
        codes = world.codes.setdefault(method_name, Counter())
        naming = id_naming(request, alias) if alias else ""
        kept = world.last_snapshot
        try:
            call(world.channel(service), method, request)
        except grpc.RpcError as exc:
            code = _code(exc)
            codes[code.name] += 1
            if alias:
                info = error_info(exc)
                id_outcomes.add((naming, info.reason if info else code.name))
            known = None
            if DISCOVER and code in FORBIDDEN:
                known = f"DISCOVER {method_name} {code.name}: {exc.details()[:160]!r}"
            if known:
                world.tolerated[known] += 1
            else:
                assert code not in FORBIDDEN, (
                    f"{method_name} answered {code.name}: {exc.details()!r}"
                )
                # Every error says why in an ErrorInfo reason (a huge input quoted in the
                # message once pushed the trailers over gRPC's limit and lost it).
                if error_info(exc) is None:
                    if DISCOVER:
                        world.tolerated[
                            f"DISCOVER {method_name} {code.name} without "
                            f"ErrorInfo: {exc.details()[:120]!r}"
                        ] += 1
                    else:
                        raise AssertionError(
                            f"{method_name} answered {code.name} without an "
                            f"ErrorInfo reason: {exc.details()!r}"
                        ) from exc
            if checks_state:
                after = snapshot(world)
                changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
                assert not changed, (
                    f"{method_name} failed with {code.name} ({exc.details()!r}) but changed "
                    f"the observable state: {changed}"
                )
            return
        codes["OK"] += 1
        if alias:
            id_outcomes.add((naming, "OK"))
        if method.name == "CreateRepository" and len(world.pools.repositories) < 8:
            world.pools.repositories.append(request.name)
            world.pools.disposable_repositories.append(request.name)
        if not is_mutating(method.name):
            # A read that succeeded changed nothing: its "before" stays the next example's
            # (were a read to change what a user observes, the next failed call's
            # comparison would show it).
            world.last_snapshot = kept
        elif checks_state:
            # Only an Auth RPC creates or deletes IAM ids.
            ensure_fixture(world, iam=service == "Auth")

    run()
    # A request without fields has one possible value; every other RPC runs its full count.
    assert world.examples[method_name] >= (max_examples if method.input_type.fields else 1)
    if alias:
        # Each way of naming the id was drawn; two different ids were CONFLICTING_IDS and
        # `id` alone got an answer about that id (done, exists, not found: not INVALID_IAM_ID
        # as for no id at all).
        assert {"id", "old", "same", "different"} <= {n for n, _ in id_outcomes}, id_outcomes
        assert ("different", "CONFLICTING_IDS") in id_outcomes, id_outcomes
        about_the_id = {r for n, r in id_outcomes if n == "id"}
        assert any(r == "OK" or r.endswith(("_EXISTS", "_NOT_FOUND")) for r in about_the_id), (
            id_outcomes
        )


def id_naming(request, alias: str) -> str:
    """How a request names its IAM id: by `id`, by the old name, both the same, two
    different ids, or neither."""
    named, old = request.id, getattr(request, alias)
    if named and old:
        return "same" if named == old else "different"
    return "id" if named else "old" if old else "neither"


def test_every_public_rpc_is_covered(world):
    """Every RPC a public service declares in protos/ is fuzzed above (and its request
    strategy draws). Fails when an RPC is added without coverage."""
    declared = {
        f"{service}/{rpc}"
        for service, rpcs in rpcs_declared_in_protos().items()
        if service != "RangeWriter"
        for rpc in rpcs
    }
    assert {
        "BranchManager/PutObject",
        "Committer/Commit",
        "CompactorSensor/GetBranchStagingStats",
        "Auth/Login",
        "Auth/Setup",
    } <= declared
    missing = declared - set(METHODS)
    assert not missing, f"public RPCs not covered by the property test: {sorted(missing)}"
    for method in METHODS.values():
        request_strategy(method, world.pools, world.scratch).validate()
