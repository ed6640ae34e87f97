"""Action files: what parses, what is refused (with the file and line), what matches."""

import pytest

from quarry.actions import files

HOOK = b"hooks:\n  - id: h\n    type: webhook\n    properties:\n      url: http://127.0.0.1/\n"


@pytest.mark.parametrize(
    ("doc", "where", "says"),
    [
        (b"name: x\non:\n  pre-comit:\n" + HOOK, "a.yaml:3", "unknown event 'pre-comit'"),
        (
            b"name: x\non:\n  pre-commit:\nhooks:\n  - id: h\n    type: webhook\n"
            b"    properties:\n      url: ftp://x/\n",
            "a.yaml:5",
            "must be an http(s) URL",
        ),
        (b"name: x\non:\n  pre-commit:\nhooks: [\n", "a.yaml:5", "expected the node content"),
        (b"on:\n  pre-commit:\n" + HOOK, "a.yaml:1", "`name` is required"),
        (b"name: x\non:\n  pre-commit:\n    branches: main\n" + HOOK, "a.yaml:4", "list of globs"),
        (
            b"name: x\non:\n  pre-commit:\n" + HOOK + b"      timeout: soon\n",
            "a.yaml:5",
            "bad timeout",
        ),
        (b"name: x\non:\n  pre-commit:\n" + HOOK + HOOK[7:], "a.yaml:9", "appears twice"),
    ],
)
def test_an_invalid_file_is_refused_naming_file_and_line(doc, where, says):
    with pytest.raises(files.InvalidActionFile) as refused:
        files.parse("_quarry_actions/a.yaml", doc)
    assert f"_quarry_actions/{where}:" in refused.value.message
    assert says in refused.value.message
    assert refused.value.reason == "INVALID_ACTION_FILE"


def test_events_match_by_branch_glob():
    action = files.parse(
        "_lakefs_actions/a.yml",
        b"name: x\non:\n  pre-merge:\n    branches: [main, 'release-*']\n  post-commit:\n" + HOOK,
    )
    assert action.matches("pre-merge", "main")
    assert action.matches("pre-merge", "release-2026")
    assert not action.matches("pre-merge", "dev")
    assert action.matches("post-commit", "anything")
    assert not action.matches("pre-commit", "main")


def test_only_files_directly_under_the_prefixes_are_action_files():
    assert files.is_action_path("_quarry_actions/a.yaml")
    assert files.is_action_path("_lakefs_actions/b.yml")
    assert not files.is_action_path("_quarry_actions/sub/a.yaml")
    assert not files.is_action_path("_quarry_actions/README.md")
    assert not files.is_action_path("data/_quarry_actions/a.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("2m", 120), ("500ms", 0.5), (1.5, 1.5), ("0s", None)]
)
def test_durations(text, seconds):
    assert files.parse_duration(text) == seconds


def test_environment_references_resolve_and_a_missing_one_is_an_error():
    assert files.resolve_env("Bearer {{ ENV.T }}", {"T": "abc"}) == "Bearer abc"
    with pytest.raises(Exception, match="'T' named by an action is not set"):
        files.resolve_env("{{ ENV.T }}", {})


def test_lakefs_revert_and_cherry_pick_events_parse():
    """lakeFS's names (pkg/graveler/hooks_handler.go): a lakeFS file using them works here."""
    events = b"".join(
        b"  %s-%s:\n" % (phase, kind)
        for kind in (b"revert", b"cherry-pick")
        for phase in (b"pre", b"post")
    )
    action = files.parse("_lakefs_actions/a.yaml", b"name: x\non:\n" + events + HOOK)
    for event in ("pre-revert", "post-revert", "pre-cherry-pick", "post-cherry-pick"):
        assert action.matches(event, "main")
    assert not action.matches("pre-commit", "main")
