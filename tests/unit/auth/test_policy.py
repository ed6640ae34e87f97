"""Policy documents: validation names the position of the problem; evaluation is default
deny, deny wins, wildcards in actions and resources, ${user}."""

from __future__ import annotations

import json

import pytest

from quarry.auth import errors as auth_errors
from quarry.auth.policy import (
    Decision,
    allows_everywhere,
    branch_arn,
    decide,
    document,
    object_arn,
    parse_policy,
    repository_arn,
    user_arn,
    wildcard_match,
)


def invalid(text: str) -> auth_errors.InvalidPolicy:
    with pytest.raises(auth_errors.InvalidPolicy) as caught:
        parse_policy("p", text)
    assert caught.value.code.name == "INVALID_ARGUMENT"
    assert caught.value.reason == "INVALID_POLICY"
    return caught.value


def statement(**fields) -> dict:
    base = {"Effect": "Allow", "Action": ["fs:ReadObject"], "Resource": "*"}
    base.update(fields)
    return base


def test_json_beyond_the_parsers_limits_is_an_invalid_policy():
    # A huge integer and very deep nesting raise ValueError / RecursionError inside json.
    assert "digits" in invalid('{"Statement": [' + "9" * 5000 + "]}").message
    invalid("[" * 100_000 + "]" * 100_000)


def test_invalid_json_names_line_and_column():
    error = invalid('{\n  "Statement": [\n    {"Effect": "Allow",, }\n  ]\n}')
    assert error.metadata["line"] == "3"
    assert "line 3 column" in error.message


@pytest.mark.parametrize(
    ("doc", "position"),
    [
        ("[]", "document"),
        ("{}", "Statement"),
        ('{"Statement": []}', "Statement"),
        ('{"Statement": [1]}', "Statement[0]"),
        (document(statement(), statement(Effect="Maybe")), "Statement[1].Effect"),
        (document(statement(Action=["fs:ReadObject", "fs:ReadObjekt"])), "Statement[0].Action[1]"),
        (document(statement(Action=["s3:*"])), "Statement[0].Action[0]"),
        (document(statement(Action=[])), "Statement[0].Action"),
        (document(statement(Resource=["*", "arn:aws:s3:::bucket"])), "Statement[0].Resource[1]"),
        (document(statement(Resource="repository/x")), "Statement[0].Resource[0]"),
        (document(statement(Condition={})), "Statement[0].Condition"),
        (
            json.dumps({"Statement": [{"Effect": "Allow", "Action": "fs:*"}]}),
            "Statement[0].Resource",
        ),
        (
            json.dumps(
                {
                    "Statement": [
                        {"Effect": "Allow", "effect": "Deny", "Action": "fs:*", "Resource": "*"}
                    ]
                }
            ),
            "Statement[0].effect",
        ),
    ],
)
def test_invalid_documents_name_the_position(doc, position):
    error = invalid(doc)
    assert error.metadata["position"] == position
    assert position in error.message


def test_valid_forms():
    # Strings or lists, lakeFS's lowercase keys, wildcard actions matching known ones.
    parse_policy(
        "a",
        document(
            statement(
                Action="fs:Read*",
                Resource=[
                    repository_arn("r"),
                    "arn:quarry:auth:::user/${user}",
                    "arn:quarry:kv:::*",
                ],
            )
        ),
    )
    parse_policy(
        "b", json.dumps({"statement": [{"effect": "deny", "action": ["auth:*"], "resource": "*"}]})
    )
    parse_policy("c", document(statement(Action=["fs:?eadObject", "*", "retention:*"])))


def allow(actions, resource="*"):
    return {"Effect": "Allow", "Action": actions, "Resource": resource}


def deny(actions, resource="*"):
    return {"Effect": "Deny", "Action": actions, "Resource": resource}


def verdict(statements, action, resources, user="u"):
    policy = parse_policy("p", document(*statements))
    return decide([policy], action, resources, user)[0]


def test_default_deny():
    assert verdict([allow(["fs:ReadObject"])], "fs:WriteObject", ["*"]) is Decision.NO_GRANT
    assert decide([], "fs:ReadObject", [object_arn("r", "a")], "u")[0] is Decision.NO_GRANT
    # No resources at all is not "everything allowed".
    assert (
        decide([parse_policy("p", document(allow("*")))], "fs:ReadObject", [], "u")[0]
        is Decision.NO_GRANT
    )


def test_action_wildcards():
    grant = [allow(["fs:Read*"])]
    assert verdict(grant, "fs:ReadObject", ["x"]) is Decision.ALLOW
    assert verdict(grant, "fs:ReadRepository", ["x"]) is Decision.ALLOW
    assert verdict(grant, "fs:WriteObject", ["x"]) is Decision.NO_GRANT
    assert verdict([allow(["fs:?eadObject"])], "fs:ReadObject", ["x"]) is Decision.ALLOW
    assert verdict([allow(["fs:?eadObject"])], "fs:RReadObject", ["x"]) is Decision.NO_GRANT
    assert verdict([allow(["*"])], "auth:DeleteUser", ["x"]) is Decision.ALLOW


def test_resource_wildcards():
    grant = [allow(["fs:*"], "arn:quarry:fs:::repository/data/object/public/*")]
    assert verdict(grant, "fs:ReadObject", [object_arn("data", "public/a/b.csv")]) is Decision.ALLOW
    assert (
        verdict(grant, "fs:ReadObject", [object_arn("data", "private/a.csv")]) is Decision.NO_GRANT
    )
    assert (
        verdict(grant, "fs:ReadObject", [object_arn("database", "public/a")]) is Decision.NO_GRANT
    )
    one = [allow(["fs:ReadBranch"], "arn:quarry:fs:::repository/r/branch/dev-?")]
    assert verdict(one, "fs:ReadBranch", [branch_arn("r", "dev-1")]) is Decision.ALLOW
    assert verdict(one, "fs:ReadBranch", [branch_arn("r", "dev-10")]) is Decision.NO_GRANT
    # Regex metacharacters in a pattern are literal.
    dots = [allow(["fs:ReadObject"], "arn:quarry:fs:::repository/r/object/a.b")]
    assert verdict(dots, "fs:ReadObject", [object_arn("r", "aXb")]) is Decision.NO_GRANT


def test_a_lakefs_policy_works_as_written():
    """An exported lakeFS policy names `arn:lakefs:` resources: read as `arn:quarry:`, with
    the same matching (never wider: a lakeFS ARN of another shape is still refused)."""
    grant = [allow(["fs:ReadObject"], "arn:lakefs:fs:::repository/data/object/public/*")]
    assert verdict(grant, "fs:ReadObject", [object_arn("data", "public/a")]) is Decision.ALLOW
    assert verdict(grant, "fs:ReadObject", [object_arn("data", "private/a")]) is Decision.NO_GRANT
    denied = [allow(["fs:*"]), deny(["fs:*"], "arn:lakefs:fs:::repository/data/branch/main")]
    assert verdict(denied, "fs:CreateCommit", [branch_arn("data", "main")]) is Decision.DENY
    invalid(document(allow(["fs:ReadObject"], "arn:lakefs:fs:::nothing/x")))
    invalid(document(allow(["fs:ReadObject"], "arn:lakefsx:fs:::repository/x")))


def test_deny_wins_over_allow_in_any_order_and_any_policy():
    statements = [
        allow(["fs:*"]),
        deny(["fs:WriteObject"], "arn:quarry:fs:::repository/r/object/locked/*"),
    ]
    for ordered in (statements, list(reversed(statements))):
        assert verdict(ordered, "fs:WriteObject", [object_arn("r", "locked/x")]) is Decision.DENY
        assert verdict(ordered, "fs:WriteObject", [object_arn("r", "open/x")]) is Decision.ALLOW
    policies = [
        parse_policy("a", document(allow("*"))),
        parse_policy("b", document(deny(["fs:Delete*"]))),
    ]
    assert decide(policies, "fs:DeleteObject", ["x"], "u")[0] is Decision.DENY


def test_every_resource_of_a_bulk_request_must_be_allowed():
    statements = [
        allow(["fs:WriteObject"]),
        deny(["fs:WriteObject"], "arn:quarry:fs:::repository/r/object/locked/*"),
    ]
    policy = parse_policy("p", document(*statements))
    resources = [object_arn("r", "open/1"), object_arn("r", "locked/2"), object_arn("r", "x")]
    assert decide([policy], "fs:WriteObject", resources, "u") == (Decision.DENY, resources[1])


def test_user_variable():
    own = [allow(["auth:CreateCredentials"], "arn:quarry:auth:::user/${user}")]
    assert verdict(own, "auth:CreateCredentials", [user_arn("alice")], "alice") is Decision.ALLOW
    assert verdict(own, "auth:CreateCredentials", [user_arn("bob")], "alice") is Decision.NO_GRANT
    assert verdict(own, "auth:CreateCredentials", [user_arn("alice")], None) is Decision.NO_GRANT


def test_wildcard_match_basics():
    assert wildcard_match("*", "")
    assert wildcard_match("a*c", "a/b/c")
    assert not wildcard_match("a?c", "ac")
    assert not wildcard_match("abc", "abcd")


def test_a_bulk_request_under_an_allow_on_everything_is_decided_once_deny_still_wins():
    """decide() allows a whole batch at once under an Allow on "*" — only while no Deny names
    the action; a Deny on any one object still refuses the batch, naming that object."""
    resources = [object_arn("r", f"in/{i}") for i in range(1000)]
    everything = [allow(["fs:*"]), deny(["fs:DeleteObject"])]  # a Deny of another action
    assert verdict(everything, "fs:ImportFromStorage", resources) is Decision.ALLOW
    locked = [*everything, deny(["fs:Import*"], "arn:quarry:fs:::repository/r/object/in/999")]
    policy = parse_policy("p", document(*locked))
    assert decide([policy], "fs:ImportFromStorage", resources, "u") == (
        Decision.DENY,
        resources[-1],
    )
    other_action = [allow(["fs:ReadObject"])]
    assert verdict(other_action, "fs:ImportFromStorage", resources) is Decision.NO_GRANT


def test_allowed_everywhere_only_under_an_allow_on_everything_and_no_deny_of_the_action():
    """allows_everywhere lets a caller skip finding the resources of a large request: true
    only when an Allow on "*" names the action and no Deny names it, whatever its resource."""

    def everywhere(statements, action="fs:ImportFromStorage") -> bool:
        return allows_everywhere([parse_policy("p", document(*statements))], action)

    assert everywhere([allow(["fs:*"])])
    assert everywhere([allow(["fs:*"]), deny(["fs:DeleteObject"])])  # another action's Deny
    # A Deny of the action on one object: each resource must be decided.
    assert not everywhere([allow(["fs:*"]), deny(["fs:Import*"], object_arn("r", "x"))])
    assert not everywhere([allow(["*"]), deny(["*"], "arn:quarry:fs:::repository/r*")])
    # An Allow on part of the resources, or on another action, is not everywhere.
    assert not everywhere([allow(["fs:*"], "arn:quarry:fs:::repository/r/*")])
    assert not everywhere([allow(["fs:ReadObject"])])
    assert not allows_everywhere([], "fs:ImportFromStorage")  # no policy at all


def _statements(*statements: dict) -> list:
    from quarry.auth.policy import parse_policy

    return [parse_policy("p", json.dumps({"Statement": list(statements)}))] if statements else []


REPO_OBJECTS = "arn:quarry:fs:::repository/r1/object/"


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        ([{"Effect": "Allow", "Action": ["fs:*"], "Resource": "*"}], True),
        (
            [
                {
                    "Effect": "Allow",
                    "Action": ["fs:ReadObject"],
                    "Resource": "arn:quarry:fs:::repository/r1/*",
                }
            ],
            True,
        ),
        (
            [
                {
                    "Effect": "Allow",
                    "Action": ["fs:ReadObject"],
                    "Resource": "arn:quarry:fs:::repository/*",
                }
            ],
            True,
        ),
        ([{"Effect": "Allow", "Action": ["fs:ReadObject"], "Resource": REPO_OBJECTS + "*"}], True),
        # Only part of the repository's objects, or another repository's.
        (
            [{"Effect": "Allow", "Action": ["fs:ReadObject"], "Resource": REPO_OBJECTS + "pub/*"}],
            False,
        ),
        (
            [
                {
                    "Effect": "Allow",
                    "Action": ["fs:ReadObject"],
                    "Resource": "arn:quarry:fs:::repository/r1x/*",
                }
            ],
            False,
        ),
        (
            [
                {
                    "Effect": "Allow",
                    "Action": ["fs:ReadObject"],
                    "Resource": "arn:quarry:fs:::repository/r?/*",
                }
            ],
            False,
        ),
        ([{"Effect": "Allow", "Action": ["fs:WriteObject"], "Resource": "*"}], False),
        ([], False),
        # A Deny that may reach one of its objects, however it is spelled.
        (
            [
                {"Effect": "Allow", "Action": ["fs:*"], "Resource": "*"},
                {
                    "Effect": "Deny",
                    "Action": ["fs:ReadObject"],
                    "Resource": REPO_OBJECTS + "secret/*",
                },
            ],
            False,
        ),
        (
            [
                {"Effect": "Allow", "Action": ["fs:*"], "Resource": "*"},
                {
                    "Effect": "Deny",
                    "Action": ["fs:Read*"],
                    "Resource": "arn:quarry:fs:::repository/*/object/x",
                },
            ],
            False,
        ),
        (
            [
                {"Effect": "Allow", "Action": ["fs:*"], "Resource": "*"},
                {"Effect": "Deny", "Action": ["fs:ReadObject"], "Resource": REPO_OBJECTS + "a.txt"},
            ],
            False,
        ),
        # A Deny elsewhere, or of another action, does not.
        (
            [
                {"Effect": "Allow", "Action": ["fs:*"], "Resource": "*"},
                {
                    "Effect": "Deny",
                    "Action": ["fs:ReadObject"],
                    "Resource": "arn:quarry:fs:::repository/r2/*",
                },
                {"Effect": "Deny", "Action": ["fs:WriteObject"], "Resource": REPO_OBJECTS + "*"},
            ],
            True,
        ),
    ],
)
def test_allows_under_a_repositorys_objects(statements, expected):
    from quarry.auth.policy import allows_under

    assert allows_under(_statements(*statements), "fs:ReadObject", REPO_OBJECTS, "u") is expected
