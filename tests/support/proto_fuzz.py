"""Hypothesis strategies for any quarry.v1 request, built from the proto descriptors, and a
generic caller for any RPC — so a new RPC or field is fuzzed without new test code.

Values are biased toward valid-looking ones (names of repositories, branches and tags that
exist, refs that resolve, paths that are staged) mixed with garbage (unicode, empty, huge,
NUL, `..`, negative and huge numbers, page tokens that are base64 of the wrong thing), so a
good share of calls gets past validation and exercises the deep code paths.

A string field gets its strategy from its name (`repository`, `branch`, `ref`, `path`,
`page_token`, `request_id`, ...); a field name the table does not know gets generic text.
"""

from __future__ import annotations

import base64
import contextvars
import itertools
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory
from hypothesis import strategies as st

from quarry.auth.request_ids import ID_ALIASES
from quarry.v1 import (
    auth_pb2,
    branch_manager_pb2,
    committer_pb2,
    compactor_sensor_pb2,
    kv_pb2,
    server_info_pb2,
)

PROTO_DIR = Path(__file__).resolve().parents[2] / "protos" / "quarry" / "v1"
PACKAGE = "quarry.v1"
# Services only other services call (range-writer) are not part of the public surface.
INTERNAL_SERVICES = frozenset({"RangeWriter"})
# kv-gateway is public, but its keys are raw: fuzzed under a partition prefix of its own, so
# it can never overwrite a record of the repositories the other RPCs are checked against,
# and only for "never INTERNAL/UNKNOWN".
KV_SERVICE = "KVGateway"
KV_FUZZ_PARTITION_PREFIX = b"staging/proptest-fuzz-"

_MODULES = (
    auth_pb2,
    branch_manager_pb2,
    committer_pb2,
    compactor_sensor_pb2,
    kv_pb2,
    server_info_pb2,
)

Type = _descriptor.FieldDescriptor


def rpcs_declared_in_protos() -> dict[str, list[str]]:
    """Service → RPC names, read from the .proto text (independent of the generated code,
    so an RPC added to a proto but not regenerated still counts)."""
    services: dict[str, list[str]] = {}
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        current = None
        for line in proto.read_text().splitlines():
            line = line.split("//", 1)[0]
            match = re.match(r"\s*service\s+(\w+)", line)
            if match:
                current = match.group(1)
                services.setdefault(current, [])
                continue
            match = re.match(r"\s*rpc\s+(\w+)\s*\(", line)
            if match and current:
                services[current].append(match.group(1))
    return services


def public_methods() -> list[_descriptor.MethodDescriptor]:
    """Every RPC of every public service, from the generated descriptors."""
    methods = []
    for module in _MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            if service.name in INTERNAL_SERVICES:
                continue
            methods.extend(service.methods)
    return methods


def message_class(desc: _descriptor.Descriptor):
    return message_factory.GetMessageClass(desc)


def call(
    channel: grpc.Channel, method: _descriptor.MethodDescriptor, request: Any, timeout: float = 20.0
) -> Any:
    """Invoke `method` with `request` (a list of messages for a client stream); return the
    response (a list for a server stream)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    serialize = message_class(method.input_type).SerializeToString
    deserialize = message_class(method.output_type).FromString
    if method.client_streaming:
        stub = channel.stream_unary(
            path, request_serializer=serialize, response_deserializer=deserialize
        )
        return stub(iter(request), timeout=timeout)
    if method.server_streaming:
        stub = channel.unary_stream(
            path, request_serializer=serialize, response_deserializer=deserialize
        )
        return list(stub(request, timeout=timeout))
    stub = channel.unary_unary(
        path, request_serializer=serialize, response_deserializer=deserialize
    )
    return stub(request, timeout=timeout)


# ---------------------------------------------------------------- value pools


@dataclass
class Pools:
    """Valid-looking values the strategies mix with garbage; refreshed by the fixture after
    every state change (commit ids move)."""

    # The fixture repository most of the time, so calls reach its branches and objects.
    repositories: list[str] = field(default_factory=lambda: ["demo", "demo", "demo", "other"])
    # What DeleteRepository names: re-creating `demo` costs the fixture seconds.
    disposable_repositories: list[str] = field(default_factory=lambda: ["other", "demo"])
    branches: list[str] = field(default_factory=lambda: ["main", "dev"])
    tags: list[str] = field(default_factory=lambda: ["v1"])
    commit_ids: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=lambda: ["a/1.parquet"])
    namespaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=lambda: ["s3://bucket/x.parquet"])
    staging_tokens: list[str] = field(default_factory=list)
    # IAM ids the fixture keeps in existence (fuzz-only: never the admin the test calls as,
    # never a built-in policy or group, so no fuzzed change takes the test's rights away).
    iam_users: list[str] = field(default_factory=lambda: ["fz-user"])
    iam_groups: list[str] = field(default_factory=lambda: ["fz-group"])
    iam_policies: list[str] = field(default_factory=lambda: ["fz-policy"])


def _pick(values: Callable[[], list[str]], fallback: str) -> st.SearchStrategy:
    """One of the values a pool holds at draw time. The draw is an index in a fixed range,
    so the strategy's shape does not change when the pool does (Hypothesis replays and
    shrinks by shape); the pool is read when the example is generated."""

    def choose(i: int) -> str:
        current = values() or [fallback]
        return current[i % len(current)]

    return st.integers(0, 11).map(choose)


# While building the "valid" variant of a request strategy, every field takes only its
# valid-looking values (see request_strategy).
_VALID_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("valid_only", default=False)


def _weighted(
    valid: st.SearchStrategy, garbage: st.SearchStrategy, valid_share: int = 3
) -> st.SearchStrategy:
    """`valid` about valid_share/(valid_share+1) of the time; it also shrinks toward it.
    Only `valid` while the valid variant is built."""
    if _VALID_ONLY.get():
        return valid
    return st.one_of(*([valid] * valid_share), garbage)


_NASTY_TEXT = st.sampled_from(
    [
        "",
        " ",
        ".",
        "..",
        "/",
        "//",
        "../..",
        "a/../../b",
        "\x00",
        "a\x00b",
        "~",
        "^",
        "@",
        "~1",
        "^1",
        "main~",
        "main^",
        "main@@",
        "-",
        "_",
        "é",
        "日本語",
        "🙂",
        "\u202e",
        "\ud7ff",
        "a" * 300,
        "x/" * 200,
        "%00",
        "$(id)",
        "'; drop",
        "\n",
        "\t",
        "CON",
        ".quarry",
        "_quarry",
        "branches/main",
        "repos/demo",
    ]
)
_TEXT = st.one_of(
    _NASTY_TEXT, st.text(max_size=40), st.text(alphabet=st.characters(codec="utf-8"), max_size=20)
)
_HUGE_TEXT = st.sampled_from([4_000, 70_000, 300_000]).map(lambda n: "h" * n)
_GARBAGE_TEXT = st.one_of(_TEXT, _TEXT, _TEXT, _HUGE_TEXT)
_FRESH_NAMES = itertools.count()
_IMPORT_SOURCES = st.sampled_from(
    ["/proc/quarry-fuzz-missing", "file:///proc/quarry-fuzz-missing", "s3://quarry-fuzz-none/x"]
)
_PLAIN_TEXT = st.text(alphabet="abcdefghij0123456789-_ ./", max_size=20)


def _ref_strategy(pools: Pools) -> st.SearchStrategy:
    base = st.one_of(
        _pick(lambda: pools.branches, "main"),
        _pick(lambda: pools.tags, "v1"),
        st.tuples(_pick(lambda: pools.commit_ids, "0" * 64), st.sampled_from([4, 8, 64])).map(
            lambda t: t[0][: t[1]]
        ),
    )
    suffixed = st.tuples(
        base,
        st.sampled_from(["", "~", "^", "@", "~~", "^^"]),
        st.sampled_from(["", "0", "1", "2", "9", "99999999999999999999", "-1"]),
    ).map("".join)
    return _weighted(st.one_of(base, suffixed), _GARBAGE_TEXT)


def _path_strategy(pools: Pools) -> st.SearchStrategy:
    pieces = st.sampled_from(
        ["a", "b", "x", "1.parquet", "é", "..", ".", "", " ", "\x00", "日本", "a" * 100]
    )
    built = st.lists(pieces, min_size=1, max_size=4).map("/".join)
    return _weighted(st.one_of(_pick(lambda: pools.paths, "a/1.parquet"), built), _GARBAGE_TEXT, 2)


def _page_token_strategy() -> st.SearchStrategy:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=6,
    )
    state = st.dictionaries(
        st.sampled_from(["after", "skip_prefix", "frontier", "x"]), json_values, max_size=3
    )
    b64 = st.one_of(state.map(json.dumps), st.text(max_size=30), st.binary(max_size=30)).map(
        lambda v: (
            base64.urlsafe_b64encode(v if isinstance(v, bytes) else v.encode()).decode().rstrip("=")
        )
    )
    return _weighted(st.just(""), st.one_of(b64, _TEXT), 1)


def _request_id_strategy() -> st.SearchStrategy:
    return _weighted(
        st.one_of(st.just(""), st.uuids().map(str)),
        st.one_of(
            st.uuids().map(lambda u: u.hex),
            st.sampled_from([str(uuid.UUID(int=0)), "not-a-uuid"]),
            _TEXT,
        ),
        1,
    )


def _namespace_strategy(pools: Pools, scratch: Callable[[str], str]) -> st.SearchStrategy:
    """Namespaces: fresh directories, and the garbage of issue 10 item 2/3. Never `/` or a
    writable system directory: the suite may run as root and (before item 2) nothing stops a
    repository from being created there."""
    fresh = st.text(alphabet="abcdefgh", min_size=1, max_size=8).map(scratch)
    garbage = st.one_of(
        st.sampled_from(
            [
                "",
                "relative-only-in-name\x00",
                "/proc/quarry-x",
                "/sys/quarry-x",
                "/dev/null/x",
                "s3://",
                "s3:///x",
                "s3://no-such-bucket/x",
                "s3://b/../x",
                "gs://bucket/x",
                "file:///dev/null/x",
                "\x00",
            ]
        ),
        _pick(lambda: pools.namespaces, "/proc/quarry-x"),
        fresh.map(lambda p: p + "/a/../b"),
        fresh.map(lambda p: p + "\x00x"),
        fresh.map(lambda p: p + "/" + "n" * 300),
    )
    return _weighted(fresh, garbage, 1)


# Valid-looking policy parts (the Auth policy RPCs' statements and documents).
_EFFECTS = st.sampled_from(["Allow", "Deny", "allow"])
_ACTIONS = st.sampled_from(["fs:ReadObject", "fs:List*", "fs:*", "auth:UpdatePolicy"])
_RESOURCES = st.sampled_from(
    ["*", "arn:quarry:fs:::repository/demo/*", "arn:quarry:auth:::user/${user}"]
)
_DOCUMENTS = st.sampled_from(
    [
        '{"Statement":[{"Effect":"Allow","Action":["fs:Read*"],"Resource":"*"}]}',
        '{"statement":[{"effect":"deny","action":"fs:WriteObject",'
        '"resource":["arn:quarry:fs:::repository/demo/object/x"]}]}',
    ]
)
_PRINCIPAL_CHOICE_METHODS = ("AttachPolicy", "DetachPolicy")


def _iam_strategy(
    name: str, method: str, pools: Pools, either_name: bool = False
) -> st.SearchStrategy:
    """user_id / group_id / policy_id: an id the fixture keeps, a fresh one for a create,
    and for AttachPolicy/DetachPolicy often "" (they take exactly one of user and group).
    `either_name`: a field of a request that names the same id by `id` and by `name`
    (request_ids.ID_ALIASES), often "" too, so one, the other, both the same (the one kept
    id) and two different ids (two fresh ones) are all drawn."""
    pool = {
        "user_id": lambda: pools.iam_users,
        "group_id": lambda: pools.iam_groups,
        "policy_id": lambda: pools.iam_policies,
    }[name]
    valid = _pick(pool, "fz-none")
    if method.startswith("Create"):
        fresh = st.just(None).map(lambda _: f"fz-{next(_FRESH_NAMES)}")
        valid = st.one_of(valid, fresh)
    if either_name or (method in _PRINCIPAL_CHOICE_METHODS and name != "policy_id"):
        valid = st.one_of(valid, st.just(""))
    return _weighted(valid, _GARBAGE_TEXT)


def _string_strategy(
    name: str, method: str, pools: Pools, scratch: Callable[[str], str]
) -> st.SearchStrategy:
    repo = _weighted(_pick(lambda: pools.repositories, "demo"), _GARBAGE_TEXT)
    branch = _weighted(_pick(lambda: pools.branches, "main"), _GARBAGE_TEXT)
    if name in ("repository",):
        return repo
    if name == "name":
        if method == "CreateRepository":
            # A name never used before (a counter: Hypothesis would keep drawing "aaa").
            fresh = st.just(None).map(lambda _: f"fz-{next(_FRESH_NAMES)}")
            return _weighted(
                st.one_of(fresh, fresh, fresh, _pick(lambda: pools.repositories, "demo")),
                _GARBAGE_TEXT,
            )
        if method == "DeleteRepository":
            return _weighted(_pick(lambda: pools.disposable_repositories, "other"), _GARBAGE_TEXT)
        if "Repositor" in method:
            return repo
        if "Tag" in method:
            return _weighted(_pick(lambda: pools.tags + ["t-new"], "v1"), _GARBAGE_TEXT)
        return _weighted(_pick(lambda: pools.branches + ["b-new"], "main"), _GARBAGE_TEXT)
    if name in ("branch", "destination_branch", "default_branch"):
        return branch
    if name in ("ref", "source_ref", "left_ref", "right_ref"):
        return _ref_strategy(pools)
    if name in ("path", "prefix"):
        return (
            _path_strategy(pools)
            if name == "path"
            else st.one_of(st.just(""), _path_strategy(pools))
        )
    if name == "paths":
        return _path_strategy(pools)
    if name == "delimiter":
        return _weighted(st.sampled_from(["", "/"]), st.sampled_from(["//", "a", "\x00", "é"]), 2)
    if name == "page_token":
        return _page_token_strategy()
    if name == "request_id":
        return _request_id_strategy()
    if name == "storage_namespace":
        return _namespace_strategy(pools, scratch)
    if name == "physical_address":
        return _weighted(
            _pick(lambda: pools.addresses, "s3://b/x")
            | st.text(max_size=8).map(lambda s: f"s3://bucket/{s}"),
            _GARBAGE_TEXT,
            2,
        )
    if name in ("commit_id", "hint_metarange_id", "metarange_id", "id"):
        return _weighted(_pick(lambda: pools.commit_ids, "0" * 64), _GARBAGE_TEXT, 1)
    if name == "staging_token":
        return _weighted(_pick(lambda: pools.staging_tokens, "t"), _GARBAGE_TEXT, 1)
    if name in ("user_id", "group_id", "policy_id"):
        return _iam_strategy(name, method, pools)
    if name == "document":  # a policy's: sometimes none, so `statements` alone is valid
        return _weighted(st.one_of(_DOCUMENTS, st.just("")), _GARBAGE_TEXT)
    if name == "effect":
        return _weighted(_EFFECTS, _GARBAGE_TEXT)
    if name == "actions":
        return _weighted(_ACTIONS, _GARBAGE_TEXT)
    if name == "resource":
        return _weighted(_RESOURCES, _GARBAGE_TEXT)
    if name == "uri":  # an import's source: places that do not exist (never a real lake)
        return _weighted(_IMPORT_SOURCES, _GARBAGE_TEXT)
    # message, committer, checksum, content_type, reason, ...: plain text mostly.
    return _weighted(_PLAIN_TEXT, _GARBAGE_TEXT)


def _bytes_strategy(name: str) -> st.SearchStrategy:
    if name == "partition_key":
        return st.binary(max_size=20).map(lambda b: KV_FUZZ_PARTITION_PREFIX + b)
    return st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\x00", b"x" * 500_000]))


_INT64 = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, -1, 1, 2, 10, 1000, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]),
)
_INT32 = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, -1, 1, 2, 3, 100, 10_000, 2**31 - 1, -(2**31)]),
)
_UINT32 = st.integers(0, 2**32 - 1)
_UINT64 = st.integers(0, 2**64 - 1)
_DOUBLE = st.one_of(
    st.floats(), st.sampled_from([0.0, -1.0, 1.0, 1e308, float("inf"), float("nan"), -0.0])
)


def _scalar_strategy(
    fd: _descriptor.FieldDescriptor, method: str, pools: Pools, scratch: Callable[[str], str]
) -> st.SearchStrategy:
    t = fd.type
    alias = ID_ALIASES.get(fd.containing_type.full_name)
    if t == Type.TYPE_STRING and alias and fd.name in ("id", alias):
        return _iam_strategy(alias, method, pools, either_name=True)
    if t == Type.TYPE_STRING:
        return _string_strategy(fd.name, method, pools, scratch)
    if t == Type.TYPE_BYTES:
        return _bytes_strategy(fd.name)
    if t == Type.TYPE_BOOL:
        return st.booleans()
    if t in (Type.TYPE_INT64, Type.TYPE_SINT64, Type.TYPE_SFIXED64):
        if fd.name == "size_bytes":
            return _weighted(st.integers(0, 10**12), _INT64, 2)
        if fd.name == "seconds":  # google.protobuf.Timestamp
            return _weighted(st.integers(0, 4_102_444_800), _INT64, 2)
        return _INT64
    if t in (Type.TYPE_INT32, Type.TYPE_SINT32, Type.TYPE_SFIXED32):
        if fd.name == "page_size":
            return _weighted(st.integers(0, 5), _INT32, 1)
        if fd.name == "nanos":
            return _weighted(st.integers(0, 999_999_999), _INT32, 2)
        return _weighted(st.integers(0, 3), _INT32, 2)
    if t in (Type.TYPE_UINT32, Type.TYPE_FIXED32):
        return _UINT32
    if t in (Type.TYPE_UINT64, Type.TYPE_FIXED64):
        return _UINT64
    if t in (Type.TYPE_DOUBLE, Type.TYPE_FLOAT):
        return _weighted(
            st.floats(0, 1000), _DOUBLE if t == Type.TYPE_DOUBLE else st.floats(width=32), 2
        )
    if t == Type.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return _weighted(st.sampled_from(known), st.integers(-5, 1000), 3)
    raise TypeError(f"no strategy for field {fd.full_name} of type {t}")


def message_strategy(
    desc: _descriptor.Descriptor,
    method: str,
    pools: Pools,
    scratch: Callable[[str], str],
    depth: int = 0,
) -> st.SearchStrategy:
    """Any message of type `desc`: each field present or absent, with a value from the
    strategy its name and type select."""
    cls = message_class(desc)
    if desc.GetOptions().map_entry:
        raise TypeError("map entries are built by their field")
    per_field: dict[str, st.SearchStrategy] = {}
    for fd in desc.fields:
        if fd.type == Type.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
            key_fd = fd.message_type.fields_by_name["key"]
            value_fd = fd.message_type.fields_by_name["value"]
            keys = (
                _scalar_strategy(key_fd, method, pools, scratch)
                if key_fd.name != "key" or key_fd.type != Type.TYPE_STRING
                else _weighted(_pick(lambda: pools.branches + ["owner", "run"], "main"), _TEXT, 1)
            )
            values = (
                _scalar_strategy(value_fd, method, pools, scratch)
                if value_fd.type != Type.TYPE_MESSAGE
                else message_strategy(value_fd.message_type, method, pools, scratch, depth + 1)
            )
            per_field[fd.name] = st.dictionaries(
                keys, values, max_size=1 if _VALID_ONLY.get() else 3
            )
            continue
        if fd.type == Type.TYPE_MESSAGE:
            if depth > 3:
                continue
            one = message_strategy(fd.message_type, method, pools, scratch, depth + 1)
        else:
            one = _scalar_strategy(fd, method, pools, scratch)
        if fd.is_repeated:
            per_field[fd.name] = st.lists(one, min_size=1 if _VALID_ONLY.get() else 0, max_size=4)
        else:
            per_field[fd.name] = (
                st.one_of(st.none(), one)
                if fd.type == Type.TYPE_MESSAGE or fd.has_presence
                else one
            )

    def build(values: dict) -> Any:
        msg = cls()
        for name, value in values.items():
            if value is None:
                continue
            fd = desc.fields_by_name[name]
            if fd.type == Type.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
                target = getattr(msg, name)
                for k, v in value.items():
                    if fd.message_type.fields_by_name["value"].type == Type.TYPE_MESSAGE:
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif fd.is_repeated:
                getattr(msg, name).extend(value)
            elif fd.type == Type.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries(per_field).map(build)


def request_strategy(
    method: _descriptor.MethodDescriptor, pools: Pools, scratch: Callable[[str], str]
) -> st.SearchStrategy:
    """A request for `method` (a list of 1-3 requests for a client-streaming RPC): about a
    quarter all valid-looking, half valid-looking but for one top-level field drawn from the
    garbage-mixed strategy, a quarter garbage-mixed throughout — so most calls get past
    validation and each field's garbage is met one at a time, where it is easy to blame."""
    token = _VALID_ONLY.set(True)
    try:
        valid = message_strategy(method.input_type, method.name, pools, scratch)
    finally:
        _VALID_ONLY.reset(token)
    mixed = message_strategy(method.input_type, method.name, pools, scratch)
    names = [fd.name for fd in method.input_type.fields]

    def corrupt_one(drawn) -> Any:
        base, index, garbage = drawn
        out = type(base)()
        out.CopyFrom(base)
        if names:
            name = names[index % len(names)]
            out.ClearField(name)
            fd = method.input_type.fields_by_name[name]
            if fd.is_repeated or fd.type != Type.TYPE_MESSAGE:
                if fd.is_repeated:
                    getattr(out, name).MergeFrom(getattr(garbage, name))
                elif garbage.HasField(name) if fd.has_presence else True:
                    setattr(out, name, getattr(garbage, name))
            elif garbage.HasField(name):
                getattr(out, name).CopyFrom(getattr(garbage, name))
        return out

    one_field = st.tuples(valid, st.integers(0, 63), mixed).map(corrupt_one)
    one = st.one_of(valid, one_field, one_field, mixed)
    if method.client_streaming:
        return st.lists(one, min_size=1, max_size=3)
    return one
