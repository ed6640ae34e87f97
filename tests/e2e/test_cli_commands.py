"""The `quarry` client commands as a user runs them, against the whole suite running in
this test process over gRPC on loopback. The commands run in process as a child would see
them (support.cli.run_quarry: its own environment, stdin, pipes and exit code)."""

from __future__ import annotations

import hashlib
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

    def run(*args: str, expect: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess:
        result = run_quarry([*args, *targets], env, stdin=stdin or "")
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def fields(text: str) -> dict[str, str]:
    """`key:   value` lines as a dict."""
    pairs = (line.partition(":") for line in text.splitlines())
    return {key: value.strip() for key, _, value in pairs}


def test_repositories_branches_and_tags(suite, quarry):
    ns = suite.namespace("cli-refs")
    out = quarry("repo", "create", "cli-refs", ns, "--default-branch", "trunk").stdout
    assert out.strip() == f"Created repository cli-refs (default branch trunk, storage {ns})"
    table = rows(quarry("repo", "list").stdout)
    assert table[0][:3] == ["NAME", "DEFAULT", "BRANCH"]
    assert ["cli-refs", "trunk", ns] == [r for r in table if r[0] == "cli-refs"][0][:3]
    listed = json.loads(quarry("repo", "list", "--json").stdout)
    assert {"name": "cli-refs", "default_branch": "trunk", "storage_namespace": ns}.items() <= [
        r for r in listed if r["name"] == "cli-refs"
    ][0].items()
    assert fields(quarry("repo", "show", "cli-refs").stdout)["default branch"] == "trunk"

    quarry("commit", "cli-refs", "trunk", "-m", "first", "--allow-empty")
    head = json.loads(quarry("branch", "show", "cli-refs", "trunk", "--json").stdout)
    assert len(head["commit_id"]) >= 12
    out = quarry("branch", "create", "cli-refs", "feature", "--source", "trunk").stdout
    assert out.strip() == f"Created branch feature from trunk at {head['commit_id'][:12]}"
    assert [r[0] for r in rows(quarry("branch", "list", "cli-refs").stdout)] == [
        "NAME",
        "feature",
        "trunk",
    ]
    assert (
        fields(quarry("branch", "show", "cli-refs", "feature").stdout)["uncommitted changes"]
        == "no"
    )

    quarry("tag", "create", "cli-refs", "v1", "feature")
    assert rows(quarry("tag", "list", "cli-refs").stdout) == [
        ["NAME", "COMMIT"],
        ["v1", head["commit_id"][:12]],  # one id length everywhere (--full: whole)
    ]
    assert json.loads(quarry("tag", "show", "cli-refs", "v1", "--json").stdout) == {
        "name": "v1",
        "commit_id": head["commit_id"],
    }
    quarry("tag", "delete", "cli-refs", "v1")
    quarry("branch", "delete", "cli-refs", "feature")
    assert [r[0] for r in rows(quarry("branch", "list", "cli-refs").stdout)] == ["NAME", "trunk"]

    # Deleting a repository asks first; without a terminal it needs --yes.
    refused = quarry("repo", "delete", "cli-refs", expect=1)
    assert refused.stderr.startswith("quarry: CONFIRMATION_REQUIRED: ")
    quarry("repo", "delete", "cli-refs", "--yes")
    quarry("repo", "show", "cli-refs", expect=1)


def test_staging_shards_are_set_shown_and_changed(suite, quarry):
    ns = suite.namespace("cli-shards")
    quarry("repo", "create", "cli-shards", ns, "--staging-shards", "4")
    assert fields(quarry("repo", "show", "cli-shards").stdout)["staging shards"] == "4"
    out = quarry("repo", "update", "cli-shards", "--staging-shards", "8").stdout
    assert "staging shards 8" in out
    shown = json.loads(quarry("repo", "show", "cli-shards", "--json").stdout)
    assert shown["staging_shards"] == 8
    bad = quarry("repo", "update", "cli-shards", "--staging-shards", "65", expect=1)
    assert "INVALID_STAGING_SHARDS" in bad.stderr or "staging_shards must be 1..64" in bad.stderr
    assert fields(quarry("repo", "show", "cli-shards").stdout)["staging shards"] == "8"


def test_upload_stage_commit_and_inspect(suite, quarry, tmp_path):
    ns = suite.namespace("cli-data")
    quarry("repo", "create", "cli-data", ns)
    src = tmp_path / "src"
    files = {
        "a.csv": b"id,name\n1,ada\n",
        "nested/b.json": b'{"x": 1}\n',
        "nested/deeper/c.bin": bytes(range(256)) * 10,
    }
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)

    # ---- upload a directory, with the progress printer forced on ----
    put = quarry(
        "put",
        "cli-data",
        "main",
        "incoming",
        "--from",
        str(src),
        "--progress",
        "--meta",
        "source=cli",
    )
    assert put.stdout.startswith("Uploaded 3 files (")
    assert "uploading [" in put.stderr and "3/3 files" in put.stderr
    assert "staging [" in put.stderr

    for rel, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        shown = fields(quarry("stat", "cli-data", "main", f"incoming/{rel}").stdout)
        assert shown["checksum"] == digest
        assert shown["size"].startswith(f"{len(data)} (")
        assert shown["metadata"] == "source=cli"
        assert shown["path"] == f"incoming/{rel}"
        entry = json.loads(quarry("stat", "cli-data", "main", f"incoming/{rel}", "--json").stdout)
        assert entry["checksum"] == digest and entry["size_bytes"] == len(data)
        # The bytes were copied into the repository's namespace under data/<uuid>.
        stored = Path(entry["physical_address"])
        assert stored.parent == Path(ns) / "data" and stored.read_bytes() == data
    assert (
        json.loads(quarry("stat", "cli-data", "main", "incoming/a.csv", "--json").stdout)[
            "content_type"
        ]
        == "text/csv"
    )

    # ---- a single file, and an entry for an object already in storage ----
    quarry("put", "cli-data", "main", "single/", "--from", str(src / "a.csv"))
    quarry(
        "put",
        "cli-data",
        "main",
        "external/obj.parquet",
        "--address",
        "s3://elsewhere/obj.parquet",
        "--size",
        "123",
        "--checksum",
        "abc",
        "--content-type",
        "application/parquet",
        "--meta",
        "k=v",
        "--if-absent",
    )
    ext = json.loads(quarry("stat", "cli-data", "main", "external/obj.parquet", "--json").stdout)
    assert (ext["physical_address"], ext["size_bytes"], ext["metadata"]) == (
        "s3://elsewhere/obj.parquet",
        123,
        {"k": "v"},
    )
    again = quarry(
        "put", "cli-data", "main", "external/obj.parquet", "--address", "x", "--if-absent", expect=1
    )
    assert again.stderr.startswith("quarry: OBJECT_EXISTS: ")

    # ---- ls: grouped by '/', recursive over several pages ----
    top = quarry("ls", "cli-data", "main").stdout.splitlines()
    assert top[0].split() == ["MODIFIED", "SIZE", "PATH"]
    assert [line.split() for line in top[1:]] == [
        ["PRE", "external/"],
        ["PRE", "incoming/"],
        ["PRE", "single/"],
    ]
    nested = quarry("ls", "cli-data", "main", "incoming/").stdout
    assert [r[-1] for r in rows(nested)[1:]] == ["incoming/a.csv", "incoming/nested/"]
    listing = quarry("ls", "cli-data", "main", "--recursive", "--page-size", "2", "--progress")
    assert [r[-1] for r in rows(listing.stdout)[1:]] == [
        "external/obj.parquet",
        "incoming/a.csv",
        "incoming/nested/b.json",
        "incoming/nested/deeper/c.bin",
        "single/a.csv",
    ]
    assert "listing " in listing.stderr
    as_json = json.loads(quarry("ls", "cli-data", "main", "incoming/", "--json").stdout)
    assert as_json["common_prefixes"] == ["incoming/nested/"]
    assert [e["path"] for e in as_json["entries"]] == ["incoming/a.csv"]

    # ---- uncommitted diff, commit, log ----
    pending = quarry("diff", "cli-data", "main", "--uncommitted").stdout.splitlines()
    assert pending[0] == "+ external/obj.parquet" and len(pending) == 5
    out = quarry(
        "commit",
        "cli-data",
        "main",
        "-m",
        "import files",
        "--author",
        "ada",
        "--meta",
        "ticket=Q-1",
    ).stdout
    assert out.splitlines()[1].strip() == "5 added, 0 removed, 0 changed"
    c1 = json.loads(quarry("log", "cli-data", "main", "-n", "1", "--json").stdout)[0]
    assert (c1["message"], c1["committer"], c1["metadata"]) == (
        "import files",
        "ada",
        {"ticket": "Q-1"},
    )
    text = quarry("log", "cli-data", "main").stdout
    assert text.startswith(f"commit {c1['id'][:12]}\nAuthor: ada\n")
    assert "    import files" in text

    # ---- rm, diff between refs, discard, reset ----
    out = quarry("rm", "cli-data", "main", "single/a.csv", "no/such").stdout
    assert out.strip() == "Removed 1 object from cli-data/main (1 did not exist)"
    out = quarry("rm", "cli-data", "main", "--recursive", "incoming/nested/").stdout
    assert out.strip() == "Removed 2 objects from cli-data/main"
    assert quarry(
        "diff", "cli-data", "main", "--uncommitted", "--prefix", "incoming/"
    ).stdout.splitlines() == ["- incoming/nested/b.json", "- incoming/nested/deeper/c.bin"]
    quarry("discard", "cli-data", "main", "--path", "single/a.csv")
    quarry("commit", "cli-data", "main", "-m", "drop nested")
    assert quarry("diff", "cli-data", "main~1", "main").stdout.splitlines() == [
        "- incoming/nested/b.json",
        "- incoming/nested/deeper/c.bin",
    ]
    changes = json.loads(quarry("diff", "cli-data", "main~1", "main", "--json").stdout)
    assert [c["type"] for c in changes] == ["removed"] * 2
    assert [
        line.split()[1]
        for line in quarry("log", "cli-data", "main", "--oneline").stdout.splitlines()
    ][:2] == ["drop", "import"]

    quarry("put", "cli-data", "main", "scratch", "--address", "/tmp/x")
    dirty = quarry("reset", "cli-data", "main", "main~1", expect=1)
    assert dirty.stderr.startswith("quarry: DIRTY_BRANCH: ")
    out = quarry("reset", "cli-data", "main", "main~1", "--force").stdout
    assert out.strip() == f"Reset cli-data/main to {c1['id'][:12]}"
    assert quarry("diff", "cli-data", "main", "--uncommitted").stdout == ""
    quarry("stat", "cli-data", "main", "incoming/nested/b.json")


def test_errors_print_one_line_without_traceback(suite, quarry, tmp_path):
    missing = quarry("branch", "show", "no-such-repo", "main", expect=1)
    assert missing.stdout == ""
    assert missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("quarry: REPOSITORY_NOT_FOUND: ")

    bad = quarry("repo", "create", "Not_Valid", suite.namespace("x"), expect=1)
    assert bad.stderr.startswith("quarry: INVALID_NAME: ")

    local = quarry("put", "any-repo", "main", "p", "--from", str(tmp_path / "nope"), expect=1)
    assert (
        local.stderr == f"quarry: LOCAL_IO_ERROR: No such file or directory: {tmp_path / 'nope'}\n"
    )

    # Addresses also come from the QUARRY_* settings.
    env = quarry_env(
        tmp_path,
        QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
        QUARRY_COMMITTER_ADDRESS=suite.targets["committer"],
    )
    by_env = run_quarry(["repo", "show", "no-such-repo"], env)
    assert (by_env.returncode, by_env.stderr.split(":")[:2]) == (
        1,
        ["quarry", " REPOSITORY_NOT_FOUND"],
    )

    neither = quarry("diff", "any-repo", "main", expect=2)
    assert neither.stderr.startswith("quarry: USAGE: ")
    # Usage errors exit 2 and say what to give: argparse's, or the command's own.
    usage = quarry("log", "r", expect=2)
    assert "the following arguments are required: REF" in usage.stderr
    message = quarry("commit", "r", "b", expect=2)
    assert message.stderr.startswith("quarry: USAGE: ") and "-m MESSAGE" in message.stderr


def test_merge_conflict_revert_and_cherry_pick(suite, quarry):
    ns = suite.namespace("cli-merge")
    quarry("repo", "create", "cli-merge", ns)
    quarry("put", "cli-merge", "main", "a", "--address", "s3://x/a0", "--checksum", "a0")
    quarry("commit", "cli-merge", "main", "-m", "base")
    quarry("branch", "create", "cli-merge", "f", "--source", "main")
    quarry("put", "cli-merge", "f", "a", "--address", "s3://x/af", "--checksum", "af")
    quarry("put", "cli-merge", "f", "b", "--address", "s3://x/bf", "--checksum", "bf")
    quarry("commit", "cli-merge", "f", "-m", "feature")
    quarry("put", "cli-merge", "main", "a", "--address", "s3://x/am", "--checksum", "am")
    quarry("commit", "cli-merge", "main", "-m", "main change")

    # Conflicts found by a dry run exit 1 (issue 13: scripts can test it), report printed.
    dry = quarry("merge", "cli-merge", "f", "main", "--dry-run", expect=1).stdout
    assert "! a" in dry and "1 conflict(s)" in dry
    failed = quarry("merge", "cli-merge", "f", "main", expect=1)
    assert failed.stderr.startswith("quarry: MERGE_CONFLICT:")
    assert len(failed.stderr.strip().splitlines()) == 1
    diff = quarry("diff", "cli-merge", "main", "f", "--three-dot").stdout.split("\n")
    assert "! a" in diff and "+ b" in diff

    merged = quarry("merge", "cli-merge", "f", "main", "--strategy", "source-wins").stdout
    assert "1 added, 0 removed, 1 changed" in merged
    assert fields(quarry("stat", "cli-merge", "main", "a").stdout)["checksum"] == "af"
    quarry("revert", "cli-merge", "main", "main", "--parent", "1")
    assert fields(quarry("stat", "cli-merge", "main", "a").stdout)["checksum"] == "am"
    quarry("stat", "cli-merge", "main", "b", expect=1)
    conflicting = quarry("cherry-pick", "cli-merge", "main", "f", expect=1)
    assert conflicting.stderr.startswith("quarry: MERGE_CONFLICT:")  # f changed a too
    quarry("put", "cli-merge", "f", "c", "--address", "s3://x/cf", "--checksum", "cf")
    quarry("commit", "cli-merge", "f", "-m", "only c")
    quarry("cherry-pick", "cli-merge", "main", "f")
    assert fields(quarry("stat", "cli-merge", "main", "c").stdout)["checksum"] == "cf"
    quarry("stat", "cli-merge", "main", "b", expect=1)


def test_a_repointed_address_survives_the_commit(suite, quarry):
    """Issue 10.1 as the user ran it: same size, no checksum, another address."""
    quarry("repo", "create", "cli-repoint", suite.namespace("cli-repoint"))

    def address(ref: str) -> str:
        return json.loads(quarry("stat", "cli-repoint", ref, "t.parquet", "--json").stdout)[
            "physical_address"
        ]

    quarry(
        "put",
        "cli-repoint",
        "main",
        "t.parquet",
        "--address",
        "s3://b/old.parquet",
        "--size",
        "100",
    )
    quarry("commit", "cli-repoint", "main", "-m", "old")
    quarry(
        "put",
        "cli-repoint",
        "main",
        "t.parquet",
        "--address",
        "s3://b/NEW.parquet",
        "--size",
        "100",
    )
    assert address("main") == "s3://b/NEW.parquet"
    assert "t.parquet" in quarry("diff", "cli-repoint", "main", "--uncommitted").stdout
    quarry("commit", "cli-repoint", "main", "-m", "new")
    assert address("main") == address("main@") == "s3://b/NEW.parquet"


def test_repo_dump_and_restore(suite, quarry, tmp_path):
    """`quarry repo dump` to a private file and to stdout, the repository deleted, `quarry
    repo restore` from the file (and from stdin under another name): the same history, and
    the objects' bytes read back. Refusals are one line, nothing restored."""
    import os
    import stat

    ns = suite.namespace("cli-dump")
    quarry("repo", "create", "cli-dump", ns)
    src = tmp_path / "rows.csv"
    src.write_bytes(b"id\n1\n2\n")
    quarry("put", "cli-dump", "main", "rows.csv", "--from", str(src))
    quarry("commit", "cli-dump", "main", "-m", "rows")
    quarry("tag", "create", "cli-dump", "v1", "main")
    quarry("put", "cli-dump", "main", "later.csv", "--from", str(src))  # left uncommitted
    log = quarry("log", "cli-dump", "main", "--json").stdout

    dump = tmp_path / "cli-dump.jsonl"
    ran = quarry("repo", "dump", "cli-dump", "-o", str(dump))
    assert "Dumped repository cli-dump to" in ran.stdout and "2 commits" in ran.stdout
    assert "Not dumped: the uncommitted changes of main" in ran.stderr
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600  # the whole history: private
    lines = dump.read_text().splitlines()
    assert json.loads(lines[0])["header"]["repository"]["name"] == "cli-dump"
    assert "end" in json.loads(lines[-1])
    refused = quarry("repo", "dump", "cli-dump", "-o", str(dump), expect=1)
    assert "FILE_EXISTS" in refused.stderr
    piped = quarry("repo", "dump", "cli-dump").stdout
    assert piped.splitlines()[1:] == lines[1:]  # the same records after the header's time

    # The repository is live: its namespace is not for the taking.
    refused = quarry("repo", "restore", "thief", ns, "--from", str(dump), expect=1)
    assert "NAMESPACE_IN_USE" in refused.stderr and refused.stderr.count("\n") == 1
    quarry("repo", "delete", "cli-dump", "--yes")

    ran = quarry("repo", "restore", "cli-dump", ns, "--from", str(dump))
    assert (
        "Restored repository cli-dump" in ran.stdout and "2 commits, 1 branch, 1 tag" in ran.stdout
    )
    assert quarry("log", "cli-dump", "main", "--json").stdout == log
    assert quarry("cat", "cli-dump", "v1", "rows.csv").stdout == src.read_text()
    assert [r[-1] for r in rows(quarry("ls", "cli-dump", "main").stdout)[1:]] == ["rows.csv"]

    # From stdin, under another name, after another deletion.
    quarry("repo", "delete", "cli-dump", "--yes")
    restored = json.loads(
        quarry("repo", "restore", "again", ns, "--from", "-", "--json", stdin=piped).stdout
    )
    assert restored["repository"]["name"] == "again" and restored["commits"] == 2
    assert quarry("cat", "again", "main", "rows.csv").stdout == src.read_text()
    elsewhere = quarry(
        "repo", "restore", "elsewhere", str(tmp_path / "x"), "--from", str(dump), expect=1
    )
    assert "DUMP_NAMESPACE_MISMATCH" in elsewhere.stderr

    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\nnot json\n")
    refused = quarry("repo", "restore", "x", str(tmp_path / "x"), "--from", str(broken), expect=1)
    assert "CORRUPT_DUMP" in refused.stderr and "line 2" in refused.stderr
    assert not os.path.exists(tmp_path / "x" / "_quarry")


def test_a_dump_whose_reader_stops_early_fails(suite, tmp_path):
    """`quarry repo dump R | head -c 100`: the dump streams to stdout and the reader's early
    stop is a failure (exit 1, INCOMPLETE_DUMP), not "Dumped ..." and 0 (tester hAI)."""
    from support.processes import VENV_BIN

    ns = suite.namespace("cli-dump-pipe")
    with suite.client(timeout=60) as client:
        client.create_repository("cli-dump-pipe", ns)
        for i in range(400):  # a dump well past a pipe's buffer
            client.commit("cli-dump-pipe", "main", f"commit {i} " + "x" * 200, allow_empty=True)
    env = quarry_env(tmp_path / "home")
    targets = ["--branch-manager", suite.targets["branch-manager"]]
    dump = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "repo", "dump", "cli-dump-pipe", *targets],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert dump.stdout is not None and dump.stderr is not None
    assert len(dump.stdout.read(100)) == 100
    dump.stdout.close()
    err = dump.stderr.read().decode()
    assert dump.wait(timeout=60) == 1, err
    assert err.startswith("quarry: INCOMPLETE_DUMP: ") and err.count("\n") == 1, err
