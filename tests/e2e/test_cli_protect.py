"""`quarry branch-protect add | list | delete` as a user runs them, against the whole
suite running in this test process (the commands in process as a child would see them,
support.cli); what it stores is
enforced by the servers (a protected branch refuses writes, other branches do not)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.cli import run_quarry
from support.processes import quarry_env
from support.suite import suite_fixture

suite = suite_fixture()


@pytest.fixture(scope="module")
def quarry(suite, tmp_path_factory):
    env = quarry_env(tmp_path_factory.mktemp("cli-home"))
    targets = [
        "--branch-manager",
        suite.targets["branch-manager"],
        "--committer",
        suite.targets["committer"],
    ]

    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
        result = run_quarry([*args, *targets], env)
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def test_add_list_delete_and_enforcement(suite, quarry, tmp_path):
    quarry("repo", "create", "cli-protect", suite.namespace("cli-protect"))
    assert rows(quarry("branch-protect", "list", "cli-protect").stdout) == [["PATTERN", "BLOCKED"]]

    quarry("branch-protect", "add", "cli-protect", "main")
    quarry("branch-protect", "add", "cli-protect", "release-*", "--block", "commit")
    assert rows(quarry("branch-protect", "list", "cli-protect").stdout)[1:] == [
        ["main", "staging-write,commit"],
        ["release-*", "commit"],
    ]
    listed = json.loads(quarry("branch-protect", "list", "cli-protect", "--json").stdout)
    assert [r["pattern"] for r in listed] == ["main", "release-*"]

    # Adding a pattern again replaces its rule.
    quarry("branch-protect", "add", "cli-protect", "release-*", "--block", "staging-write")
    assert rows(quarry("branch-protect", "list", "cli-protect").stdout)[1:] == [
        ["main", "staging-write,commit"],
        ["release-*", "staging-write"],
    ]

    data = tmp_path / "data.txt"
    data.write_text("hello")
    refused = quarry("put", "cli-protect", "main", "a.txt", "--from", str(data), expect=1)
    assert refused.stderr.startswith("quarry: BRANCH_PROTECTED: "), refused.stderr
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(str(i))
    refused = quarry("put", "cli-protect", "main", "many/", "--from", str(folder), expect=1)
    assert "BRANCH_PROTECTED" in refused.stderr
    # The refused puts' uploads are removed (they were left in the lake, nobody's).
    uploads = Path(suite.namespace("cli-protect")) / "data"
    assert not uploads.exists() or list(uploads.iterdir()) == []
    quarry("branch", "create", "cli-protect", "dev", "--source", "main")
    quarry("put", "cli-protect", "dev", "a.txt", "--from", str(data))
    assert len(list(uploads.iterdir())) == 1  # a staged upload stays

    quarry("branch-protect", "delete", "cli-protect", "main")
    assert rows(quarry("branch-protect", "list", "cli-protect").stdout)[1:] == [
        ["release-*", "staging-write"]
    ]
    missing = quarry("branch-protect", "delete", "cli-protect", "main", expect=1)
    assert missing.stderr.startswith("quarry: RULE_NOT_FOUND: ")
    bad = quarry("branch-protect", "add", "cli-protect", "x", "--block", "push", expect=2)
    assert "staging-write, commit" in bad.stderr
    # --block repeated adds up (it kept only the last one: a weaker rule than asked for).
    quarry(
        "branch-protect", "add", "cli-protect", "x", "--block", "commit", "--block", "staging-write"
    )
    assert ["x", "staging-write,commit"] in rows(
        quarry("branch-protect", "list", "cli-protect").stdout
    )


def test_a_put_to_a_tag_says_it_is_a_tag(suite, quarry, tmp_path):
    """It said "branch 'v1' not found" (other writes answer NOT_A_BRANCH)."""
    quarry("repo", "create", "cli-tagput", suite.namespace("cli-tagput"))
    quarry("tag", "create", "cli-tagput", "v1", "main")
    data = tmp_path / "t.txt"
    data.write_text("t")
    refused = quarry("put", "cli-tagput", "v1", "t.txt", "--from", str(data), expect=1)
    assert refused.stderr.startswith("quarry: NOT_A_BRANCH: "), refused.stderr
    missing = quarry("put", "cli-tagput", "nope", "t.txt", "--from", str(data), expect=1)
    assert "BRANCH_NOT_FOUND" in missing.stderr
