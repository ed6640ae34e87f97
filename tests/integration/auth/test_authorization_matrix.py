"""The authorization matrix over the REAL running suite (every service its own gRPC server
built by create_server with auth on, as `quarry serve` runs it), for EVERY RPC of the
declaration table — generated from the table, so an RPC added there is covered here:

  * ACTION rules: a user allowed exactly that action passes the check; a user allowed
    everything but with an explicit Deny of the action, and a user with no grant at all,
    are PERMISSION_DENIED naming the action (decision deny / no_grant).
  * SERVICE_ONLY rules: the admin user is refused (SERVICE_PRINCIPAL_REQUIRED); a service
    token passes.
  * AUTHENTICATED: any valid user passes; OPEN: no token needed.
  * Every non-OPEN rule: no token is UNAUTHENTICATED / TOKEN_MISSING.
  * The Auth RPCs that name their user, group or policy by `id` or by `<kind>_id`: either
    field alone (or both the same) is checked on the id it names; two different ids are
    INVALID_ARGUMENT / CONFLICTING_IDS for everyone. Their id is not a valid IAM id, so
    these calls change nothing either.

"Passes" means the call is not refused by auth (it may then fail on its own terms, e.g.
INVALID_ARGUMENT for the empty request) — requests are empty messages, so nothing here
changes the suite's data.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pool

from quarry.auth.declarations import RULES, Access
from quarry.auth.policy import document, group_arn, policy_arn, user_arn
from quarry.auth.request_ids import ID_ALIASES
from quarry.auth.store import IamStore
from quarry.kv.memory import MemoryStore
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import (  # noqa: F401 — registers every service's descriptors
    auth_pb2,
    branch_manager_pb2,
    committer_pb2,
    compactor_sensor_pb2,
    kv_pb2,
    range_writer_pb2,
    server_info_pb2,
)
from support.auth import (
    FAST_HASH,
    TEST_ADMIN,
    bearer,
    raw_channel,
    service_token,
    setup_test_admin,
    user_token,
)
from support.proto_fuzz import message_class
from support.suite import suite_fixture

TARGET_OF_SERVICE = {
    "Auth": "branch-manager",
    "BranchManager": "branch-manager",
    "ServerInfo": "branch-manager",
    "Committer": "committer",
    "CompactorSensor": "compactor-sensor",
    "KVGateway": "kv-gateway",
    "RangeWriter": "range-writer",
}
AUTH_REFUSALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
ACTIONS = sorted({rule.action for rule in RULES.values() if rule.access is Access.ACTION})
NO_GRANT = "matrix-nogrant"


def allowed_user(action: str) -> str:
    return f"matrix-allow-{ACTIONS.index(action)}"


def denied_user(action: str) -> str:
    return f"matrix-deny-{ACTIONS.index(action)}"


# Rules that check more actions than their own (StartImport: the source, the destination,
# the commit): their allowed user has every one of them.
COMBINED = sorted(method for method, rule in RULES.items() if rule.also)


def allowed_for(method: str) -> str:
    rule = RULES[method]
    if rule.also:
        return f"matrix-allow-rule-{COMBINED.index(method)}"
    return allowed_user(rule.action)


@pytest.fixture(scope="module")
def matrix_backend():
    """The suite's store, with a user allowed and a user denied each action."""
    backend = MemoryStore()
    iam = IamStore(backend, hash_cost=FAST_HASH)
    setup_test_admin(backend)  # first: Setup is once per installation, users make it installed
    iam.create_user(NO_GRANT)
    for i, action in enumerate(ACTIONS):
        iam.create_policy(
            f"matrix-allow-{i}", document({"Effect": "Allow", "Action": [action], "Resource": "*"})
        )
        iam.create_policy(
            f"matrix-deny-{i}",
            document(
                {"Effect": "Allow", "Action": ["*"], "Resource": "*"},
                {"Effect": "Deny", "Action": [action], "Resource": "*"},
            ),
        )
        iam.create_user(allowed_user(action))
        iam.attach_user_policy(allowed_user(action), f"matrix-allow-{i}")
        iam.create_user(denied_user(action))
        iam.attach_user_policy(denied_user(action), f"matrix-deny-{i}")
    for i, method in enumerate(COMBINED):
        actions = [RULES[method].action, *(action for action, _ in RULES[method].also)]
        iam.create_policy(
            f"matrix-allow-rule-{i}",
            document({"Effect": "Allow", "Action": actions, "Resource": "*"}),
        )
        iam.create_user(f"matrix-allow-rule-{i}")
        iam.attach_user_policy(f"matrix-allow-rule-{i}", f"matrix-allow-rule-{i}")
    return backend


running = suite_fixture(name="running", backend="matrix_backend", compactor_sensor=True)


@pytest.fixture(scope="module")
def suite(running):
    """The running suite, with a raw channel (no token of its own) to each service."""
    channels = {name: raw_channel(target) for name, target in running.targets.items()}
    running.raw_channels = channels
    yield running
    for channel in channels.values():
        channel.close()


def invoke(suite, method: str, token: str | None, **fields) -> grpc.StatusCode:
    """Call `method` with an empty request (a one-message stream for a client stream), or
    one of these `fields`, and `token`; the status code (OK when it succeeded)."""
    full = method.lstrip("/").replace("/", ".")
    descriptor = descriptor_pool.Default().FindMethodByName(full)
    channel = suite.raw_channels[TARGET_OF_SERVICE[descriptor.containing_service.name]]
    request_type = message_class(descriptor.input_type)
    response_type = message_class(descriptor.output_type)
    kinds = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }
    stub = kinds[(descriptor.client_streaming, descriptor.server_streaming)](
        method,
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    message = request_type(**fields)
    request = iter([message]) if descriptor.client_streaming else message
    metadata = bearer(token) if token else ()
    try:
        reply = stub(request, metadata=metadata, timeout=20)
        if descriptor.server_streaming:
            list(reply)
    except grpc.RpcError as error:
        refused = from_rpc_error(error)
        invoke.last_error = refused
        return error.code()
    return grpc.StatusCode.OK


def refusal(suite, method: str, token: str | None, **fields):
    code = invoke(suite, method, token, **fields)
    assert code in AUTH_REFUSALS, f"{method} was not refused ({code.name})"
    return invoke.last_error


def passes(suite, method: str, token: str | None, **fields) -> None:
    code = invoke(suite, method, token, **fields)
    if code in AUTH_REFUSALS:
        error = invoke.last_error
        raise AssertionError(f"{method} refused by auth: {code.name} {error.reason}: {error}")


@pytest.mark.parametrize("method", sorted(RULES))
def test_every_declared_rpc_admits_exactly_whom_its_rule_says(suite, method):
    rule = RULES[method]
    if rule.access is Access.OPEN:
        code = invoke(suite, method, None)
        if code in AUTH_REFUSALS:  # Login with an empty key: its own answer, not a token's
            error = invoke.last_error
            assert (error.code.name, error.reason) == ("UNAUTHENTICATED", "INVALID_CREDENTIALS")
        return
    missing = refusal(suite, method, None)
    assert (missing.code.name, missing.reason) == ("UNAUTHENTICATED", "TOKEN_MISSING")
    if rule.access is Access.AUTHENTICATED:
        passes(suite, method, user_token(NO_GRANT))
    elif rule.access is Access.SERVICE_ONLY:
        for user in (TEST_ADMIN, NO_GRANT):
            error = refusal(suite, method, user_token(user))
            assert (error.code.name, error.reason) == (
                "PERMISSION_DENIED",
                "SERVICE_PRINCIPAL_REQUIRED",
            ), method
        passes(suite, method, service_token("branch-manager"))
    else:
        assert rule.access is Access.ACTION
        passes(suite, method, user_token(allowed_for(method)))
        if rule.also:
            # Its own action alone is not enough: each further action is checked too.
            error = refusal(suite, method, user_token(allowed_user(rule.action)))
            assert error.metadata["decision"] == "no_grant", method
            assert error.metadata["action"] in {action for action, _ in rule.also}, method
        passes(suite, method, service_token("compactor-sensor"))
        for user, decision in ((denied_user(rule.action), "deny"), (NO_GRANT, "no_grant")):
            error = refusal(suite, method, user_token(user))
            assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "PERMISSION_DENIED")
            assert (error.metadata["action"], error.metadata["decision"]) == (
                rule.action,
                decision,
            ), method
            assert rule.action in error.message


def test_the_matrix_covers_every_service_of_the_suite():
    services = {m.split("/")[1].removeprefix("quarry.v1.") for m in RULES}
    assert services == set(TARGET_OF_SERVICE)


# The Auth RPCs whose request names its user, group or policy by `id` as well as by the
# older `<kind>_id` (quarry.auth.request_ids): each name alone is checked on the id it gives.
ID_NAMED = sorted(
    method
    for method in RULES
    if descriptor_pool.Default()
    .FindMethodByName(method.lstrip("/").replace("/", "."))
    .input_type.full_name
    in ID_ALIASES
)
ARN_OF_FIELD = {"user_id": user_arn, "group_id": group_arn, "policy_id": policy_arn}
# Not a valid IAM id: a call that passes auth fails INVALID_IAM_ID (or INVALID_POLICY for a
# policy without a document) and changes nothing.
ABSENT_ID = "matrix absent!"


@pytest.mark.parametrize("method", ID_NAMED)
def test_rpcs_naming_their_id_by_either_field_are_checked_on_that_id(suite, method):
    rule = RULES[method]
    input_type = (
        descriptor_pool.Default().FindMethodByName(method.lstrip("/").replace("/", ".")).input_type
    )
    field = ID_ALIASES[input_type.full_name]
    for fields in ({"id": ABSENT_ID}, {field: ABSENT_ID}, {"id": ABSENT_ID, field: ABSENT_ID}):
        passes(suite, method, user_token(allowed_for(method)), **fields)
        passes(suite, method, service_token("compactor-sensor"), **fields)
        for user, decision in ((denied_user(rule.action), "deny"), (NO_GRANT, "no_grant")):
            error = refusal(suite, method, user_token(user), **fields)
            assert (error.code.name, error.metadata["decision"]) == (
                "PERMISSION_DENIED",
                decision,
            ), (method, fields)
            assert error.metadata["resource"] == ARN_OF_FIELD[field](ABSENT_ID), (method, fields)
    # Two different ids: refused whoever asks (users before any decision; a service, whose
    # reads skip the declaration, by the servicer's reading of the same ids).
    conflicting = {"id": ABSENT_ID, field: NO_GRANT}
    tokens = [user_token(allowed_user(rule.action)), user_token(denied_user(rule.action))]
    tokens += [user_token(NO_GRANT), service_token("compactor-sensor")]
    for token in tokens:
        code = invoke(suite, method, token, **conflicting)
        error = invoke.last_error
        assert (code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CONFLICTING_IDS")
