"""The declaration table covers every RPC of the protos, and every entry can be evaluated
on a real request of its method."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from quarry.auth.declarations import RULES, Access
from quarry.auth.policy import ACTIONS
from quarry.auth.request_ids import ID_ALIASES
from support.proto_fuzz import rpcs_declared_in_protos

PROTOS = Path(__file__).resolve().parents[3] / "protos" / "quarry" / "v1"
READ_ONLY_PREFIXES = ("Get", "List", "Stat", "Diff", "Log", "Find", "Scan", "BatchGet")
READ_ONLY_NAMES = {"WhoAmI", "CheckPermission"}
# Audited like a change although they change nothing: a sign-in, refused or not, is a
# security event (and "Login" is not a read of the log), and so is a repository's whole
# history leaving in a dump.
AUDITED_NAMES = {"Login", "DumpRepository"}
INTERNAL = {
    "KVGateway/SetItem",
    "KVGateway/SetItemIf",
    "KVGateway/DeleteItem",
    "KVGateway/BatchSetItems",
    "KVGateway/SetItemsThenGet",
    "KVGateway/BatchDeleteItems",
    "CompactorSensor/ReportStagingActivity",
    "RangeWriter/ApplyChanges",
    "RangeWriter/MergeMetaRanges",
    "RangeWriter/WriteMetaRange",
    "RangeWriter/GetMetaRange",
    "RangeWriter/ClaimNamespace",
    "RangeWriter/ReplacePrefixes",
    # The s3-gateway's SigV4 check: a signature oracle for the suite's services only.
    "Auth/VerifySignature",
}


def proto_rpcs() -> set[str]:
    """`/quarry.v1.Service/Method` of every RPC, parsed from the .proto sources (the suite's
    one parser: a new RPC fails this test before anyone regenerates code)."""
    return {
        f"/quarry.v1.{service}/{rpc}"
        for service, rpcs in rpcs_declared_in_protos().items()
        for rpc in rpcs
    }


def test_the_parser_sees_the_services():
    rpcs = proto_rpcs()
    assert "/quarry.v1.BranchManager/PutObjects" in rpcs
    assert "/quarry.v1.Auth/Login" in rpcs
    assert len(rpcs) >= 80


def test_every_rpc_has_a_declaration():
    missing = sorted(set(proto_rpcs()) - set(RULES))
    assert missing == [], f"RPCs without an access declaration: {missing}"


def test_no_declaration_names_a_missing_rpc():
    assert sorted(set(RULES) - set(proto_rpcs())) == []


def test_internal_rpcs_are_service_only_and_nothing_else_is():
    service_only = {
        name.removeprefix("/quarry.v1.")
        for name, rule in RULES.items()
        if rule.access is Access.SERVICE_ONLY
    }
    assert service_only == INTERNAL


def test_only_serverinfo_login_and_setup_are_open():
    # Setup is open by the auth contract: it refuses (ADMIN_EXISTS) once an admin exists.
    assert {n for n, r in RULES.items() if r.access is Access.OPEN} == {
        "/quarry.v1.ServerInfo/GetServerInfo",
        "/quarry.v1.Auth/Login",
        "/quarry.v1.Auth/Setup",
    }


def test_mutating_flags_follow_the_names():
    for name, rule in RULES.items():
        method = name.rsplit("/", 1)[1]
        reads = method.startswith(READ_ONLY_PREFIXES) or method in READ_ONLY_NAMES
        reads = reads and method not in AUDITED_NAMES
        assert rule.mutating is not reads, name


def _method_descriptor(full_name: str):
    service, method = full_name.removeprefix("/quarry.v1.").split("/")
    for path in PROTOS.glob("*.proto"):
        module = importlib.import_module(f"quarry.v1.{path.stem}_pb2")
        found = module.DESCRIPTOR.services_by_name.get(service)
        if found is not None:
            return found.methods_by_name[method]
    raise AssertionError(full_name)


def _sample_request(descriptor):
    from google.protobuf import message_factory

    request = message_factory.GetMessageClass(descriptor.input_type)()
    for field in descriptor.input_type.fields:
        if field.type == field.TYPE_STRING and isinstance(getattr(request, field.name), str):
            setattr(request, field.name, f"s-{field.name}")
    alias = ID_ALIASES.get(descriptor.input_type.full_name)
    if alias:  # `id` is another name for `alias`: both set name the same id
        request.id = getattr(request, alias)
    if hasattr(request, "entry"):
        request.entry.path = "s-path"
    if hasattr(request, "entries"):
        request.entries.add(path="s-path")
    if hasattr(request, "paths"):
        request.paths.append("s-path")
    if hasattr(request, "partition_key"):
        request.partition_key = b"quarry"
    return request


@pytest.mark.parametrize("name", sorted(n for n, r in RULES.items() if r.access is Access.ACTION))
def test_every_action_rule_evaluates_on_a_real_request(name):
    rule = RULES[name]
    assert rule.action in ACTIONS, f"{name}: {rule.action} is not a known action"
    request = _sample_request(_method_descriptor(name))
    resources = rule.resources(request, request) if rule.client_stream else rule.resources(request)
    assert resources
    for resource in resources:
        assert resource == "*" or resource.startswith("arn:quarry:"), resource
        if resource.startswith("arn:quarry:fs:::repository/"):
            # The repository the request names, never another one.
            named = request.repository if hasattr(request, "repository") else request.name
            assert resource.startswith(f"arn:quarry:fs:::repository/{named}"), resource
        elif resource.startswith("arn:quarry:auth:::"):
            assert resource.rsplit("/", 1)[1].startswith("s-"), resource


@pytest.mark.parametrize("method", ["AttachPolicy", "DetachPolicy"])
def test_attach_policy_is_checked_on_every_principal_it_names(method):
    """As ...ToUser/...ToGroup: the user or the group; both when both are named, so naming
    an allowed group cannot carry a user the caller may not touch."""
    from quarry.v1 import auth_pb2

    rule = RULES[f"/quarry.v1.Auth/{method}"]
    request = getattr(auth_pb2, f"{method}Request")
    assert rule.action == f"auth:{method}"
    assert rule.resources(request(policy_id="p", user_id="u")) == ("arn:quarry:auth:::user/u",)
    assert rule.resources(request(policy_id="p", group_id="g")) == ("arn:quarry:auth:::group/g",)
    assert rule.resources(request(policy_id="p", user_id="u", group_id="g")) == (
        "arn:quarry:auth:::user/u",
        "arn:quarry:auth:::group/g",
    )
    assert rule.resources(request(policy_id="p")) == ("arn:quarry:auth:::user/",)
