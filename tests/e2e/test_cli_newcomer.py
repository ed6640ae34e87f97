"""The `quarry` command as a newcomer meets it (issue 25), run as users run it against
the suite running in this process (the commands in process as a child would see them,
support.cli; `serve` and bash's completion as real processes) — the token
kept between runs, global flags before the command, help, HEAD, merges already done,
deletes that need --force, unreachable services, usage errors, the --json vocabulary."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess

import pytest
from prometheus_client import REGISTRY

from support.cli import run_quarry
from support.processes import VENV_BIN, free_port, quarry_env
from support.suite import suite_fixture

suite = suite_fixture()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-home")


def _targets(suite) -> list[str]:
    return [
        "--branch-manager",
        suite.targets["branch-manager"],
        "--committer",
        suite.targets["committer"],
    ]


@pytest.fixture(scope="module")
def quarry(suite, home):
    env = quarry_env(home)

    def run(*args: str, expect: int = 0, extra_env: dict[str, str] | None = None):
        result = run_quarry([*args, *_targets(suite)], {**env, **(extra_env or {})})
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def bare(*args: str, home, extra_env: dict[str, str] | None = None):
    """`quarry ARGS` exactly as given (no connection options appended)."""
    return run_quarry(args, {**quarry_env(home), **(extra_env or {})})


def _logins() -> float:
    labels = {"service": "branch-manager", "method": "quarry.v1.Auth/Login", "code": "OK"}
    return REGISTRY.get_sample_value("quarry_rpc_requests_total", labels) or 0.0


# ---- the token kept between runs ---------------------------------------------------------


def test_two_commands_log_in_once_and_the_token_file_is_private(quarry, home):
    (home / "tokens.json").unlink(missing_ok=True)
    before = _logins()
    quarry("repo", "list")
    quarry("repo", "list")
    assert _logins() == before + 1
    mode = stat.S_IMODE(os.stat(home / "tokens.json").st_mode)
    assert mode == 0o600, oct(mode)


def test_a_refused_cached_token_is_dropped_and_the_cli_logs_in_once(quarry, home):
    quarry("repo", "list")  # a cached token
    path = home / "tokens.json"
    tokens = json.loads(path.read_text())
    assert len(tokens) == 1
    for entry in tokens.values():
        entry["token"] = entry["token"][:-4] + ("AAAA" if entry["token"][-4:] != "AAAA" else "BBBB")
    path.write_text(json.dumps(tokens))
    before = _logins()
    quarry("repo", "list")  # refused (bad signature): dropped, one Login, the call retried
    assert _logins() == before + 1
    quarry("repo", "list")  # the new token was cached
    assert _logins() == before + 1


# ---- git habits ------------------------------------------------------------------------------


def _history(quarry, tmp_path, repo: str) -> None:
    """`repo` with two commits on main."""
    source = tmp_path / f"{repo}.csv"
    quarry("repo", "create", repo, str(tmp_path / "lake" / repo))
    for n in (1, 2):
        source.write_text(f"a\n{n}\n")
        quarry("put", repo, "main", f"t/{n}.csv", "--from", str(source))
        quarry("commit", repo, "main", "-m", f"commit {n}")


def test_global_flags_before_the_command(suite, home):
    targets = _targets(suite)
    listed = bare(*targets, "--json", "repo", "list", home=home)
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)
    # With `=` too, and a usage error after them still names the command's options.
    joined = bare(
        f"--branch-manager={targets[1]}", "--committer", targets[3], "repo", "list", home=home
    )
    assert joined.returncode == 0, joined.stderr
    assert "is not a quarry command" not in joined.stderr


def test_quarry_and_quarry_help_print_help(home):
    for argv in ((), ("help",)):
        shown = bare(*argv, home=home)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("usage: quarry ")
        assert "repo" in shown.stdout and "commit" in shown.stdout
    create = bare("help", "repo", "create", home=home)
    assert create.returncode == 0 and create.stdout.startswith("usage: quarry repo create")
    unknown = bare("help", "comit", home=home)
    assert unknown.returncode == 2 and "Did you mean 'commit'" in unknown.stderr


def test_head_and_at_name_the_default_branch(quarry, tmp_path):
    _history(quarry, tmp_path, "heads")
    main_log = quarry("log", "heads", "main", "--oneline").stdout
    assert quarry("log", "heads", "HEAD", "--oneline").stdout == main_log
    assert quarry("log", "heads", "@", "--oneline").stdout == main_log
    assert quarry("log", "heads", "HEAD~1", "--oneline").stdout == main_log.split("\n", 1)[1]
    changed = quarry("diff", "heads", "@~1", "HEAD", "--json").stdout
    assert [(c["type"], c["path"]) for c in json.loads(changed)] == [("added", "t/2.csv")]
    refused = quarry("branch", "create", "heads", "HEAD", expect=1)
    assert "HEAD names the repository's default branch" in refused.stderr


def test_merging_what_is_already_merged_is_up_to_date(quarry, tmp_path):
    _history(quarry, tmp_path, "merged")
    quarry("branch", "create", "merged", "feature")
    again = quarry("merge", "merged", "feature", "main")
    assert again.stdout == "Already up to date.\n"
    as_json = json.loads(quarry("merge", "merged", "feature", "main", "--json").stdout)
    assert as_json == {"up_to_date": True, "source": "feature", "destination": "main"}


def test_branch_delete_refuses_to_lose_work_without_force(quarry, tmp_path):
    """Safety rule: never deletes a branch holding uncommitted changes or commits the
    default branch lacks, unless --force."""
    _history(quarry, tmp_path, "keep")
    source = tmp_path / "x.csv"
    source.write_text("x\n")
    # Commits main does not have.
    quarry("branch", "create", "keep", "ahead")
    quarry("put", "keep", "ahead", "x.csv", "--from", str(source))
    quarry("commit", "keep", "ahead", "-m", "only here")
    refused = quarry("branch", "delete", "keep", "ahead", expect=1)
    assert refused.stderr.startswith("quarry: CONFIRMATION_REQUIRED: ")
    assert "commits not merged into main" in refused.stderr and "--force" in refused.stderr
    # Staged changes.
    quarry("branch", "create", "keep", "staged")
    quarry("put", "keep", "staged", "x.csv", "--from", str(source))
    refused = quarry("branch", "delete", "keep", "staged", expect=1)
    assert "uncommitted changes" in refused.stderr
    # Changes moved out of the current staging token (a compaction, a refused merge seal
    # it) are uncommitted all the same: the record's dirty flag alone let them be deleted.
    quarry("compact", "keep", "staged")
    refused = quarry("branch", "delete", "keep", "staged", expect=1)
    assert "uncommitted changes" in refused.stderr
    shown = quarry("branch", "show", "keep", "staged").stdout.splitlines()
    assert [line.split()[-1] for line in shown if line.startswith("uncommitted")] == ["yes"]
    names = [b["name"] for b in json.loads(quarry("branch", "list", "keep", "--json").stdout)]
    assert {"ahead", "staged"} <= set(names)  # nothing deleted
    # --force deletes; a clean, merged branch goes without asking.
    quarry("branch", "delete", "keep", "ahead", "--force")
    quarry("branch", "delete", "keep", "staged", "--yes")
    quarry("branch", "create", "keep", "done")
    assert quarry("branch", "delete", "keep", "done").stdout == "Deleted branch done\n"
    names = [b["name"] for b in json.loads(quarry("branch", "list", "keep", "--json").stdout)]
    assert names == ["main"]


def test_an_unreachable_service_is_named_with_what_to_do(home):
    port = free_port()  # nothing listens there
    failed = bare("repo", "list", "--branch-manager", f"127.0.0.1:{port}", home=home)
    assert failed.returncode == 1
    assert failed.stderr.startswith(
        f"quarry: SERVICE_UNREACHABLE: cannot reach the branch-manager at 127.0.0.1:{port} "
        "(connection refused)"
    ), failed.stderr
    assert "`quarry up`" in failed.stderr
    assert failed.stderr.count("\n") == 1  # one line, no gRPC text
    as_json = bare("repo", "list", "--json", "--branch-manager", f"127.0.0.1:{port}", home=home)
    error = json.loads(as_json.stderr)["error"]
    assert (error["code"], error["reason"]) == ("UNAVAILABLE", "SERVICE_UNREACHABLE")


@pytest.mark.parametrize(
    ("service", "extra"),
    [
        ("kv-gateway", {}),
        # Its span worker processes start before the port is bound: each printed a
        # traceback when the refusal stopped it at once.
        ("range-writer", {"QUARRY_RANGE_WRITER_PROCESSES": "2"}),
    ],
)
def test_a_port_in_use_is_our_one_line_without_grpc_core_lines(tmp_path, service, extra):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        variable = f"QUARRY_{service.upper().replace('-', '_')}_PORT"
        env = quarry_env(tmp_path, **{variable: str(port)}, **extra)
        ran = subprocess.run(
            [str(VENV_BIN / "quarry"), "serve", service],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 2
    assert ran.stderr.startswith(f"quarry serve {service}: UNAVAILABLE: {service} cannot listen")
    assert ran.stderr.count("\n") == 1, ran.stderr


def test_a_usage_error_exits_2(quarry):
    neither = quarry("put", "any", "main", "p", expect=2)
    assert neither.stderr.startswith("quarry: USAGE: put needs --address ADDR")
    as_json = quarry("put", "any", "main", "p", "--json", expect=2)
    assert json.loads(as_json.stderr)["error"]["reason"] == "USAGE"


def test_json_speaks_the_cli_vocabulary(quarry, tmp_path):
    _history(quarry, tmp_path, "words")
    diff = json.loads(quarry("diff", "words", "main~1", "main", "--json").stdout)
    assert {c["type"] for c in diff} == {"added"}
    quarry("branch-protect", "add", "words", "main")
    (rule,) = json.loads(quarry("branch-protect", "list", "words", "--json").stdout)
    assert sorted(rule["blocked_actions"]) == ["commit", "staging-write"]


def test_the_token_and_the_credentials_for_s3_tools_as_json(quarry, home):
    """`--json` on every command: these two printed a bare token and `export` lines."""
    from support.auth import TEST_ACCESS_KEY_ID

    token = json.loads(quarry("auth", "token", "--json").stdout)["token"]
    assert token.count(".") == 2  # a JWT
    variables = json.loads(bare("auth", "credentials", "env", "--json", home=home).stdout)
    assert variables["AWS_ACCESS_KEY_ID"] == TEST_ACCESS_KEY_ID
    assert variables["AWS_SECRET_ACCESS_KEY"] and variables["AWS_DEFAULT_REGION"]


def test_one_commit_id_length_everywhere_and_full_ids_with_full(quarry, tmp_path):
    _history(quarry, tmp_path, "ids")
    head = json.loads(quarry("branch", "show", "ids", "main", "--json").stdout)["commit_id"]
    assert len(head) == 64  # JSON: whole ids
    short = head[:12]
    quarry("tag", "create", "ids", "v1", "main")
    shown = [
        quarry("log", "ids", "main", "--oneline").stdout.split()[0],
        quarry("log", "ids", "main").stdout.split()[1],
        quarry("tag", "list", "ids").stdout.splitlines()[1].split()[1],
        quarry("tag", "show", "ids", "v1").stdout.split("commit:")[1].split()[0],
        quarry("branch", "show", "ids", "main").stdout.split("commit:")[1].split()[0],
        quarry("branch", "list", "ids").stdout.splitlines()[1].split()[1],
    ]
    assert shown == [short] * len(shown)
    assert quarry("log", "ids", "main", "--oneline", "--full").stdout.split()[0] == head
    assert quarry("tag", "list", "ids", "--full").stdout.splitlines()[1].split()[1] == head


def test_auth_groups_members(quarry):
    quarry("auth", "users", "create", "ann")
    quarry("auth", "groups", "create", "readers")
    quarry("auth", "groups", "add-member", "readers", "ann")
    table = quarry("auth", "groups", "members", "readers").stdout.splitlines()
    assert table[0].split() == ["ID", "EMAIL", "CREATED"]
    assert [row.split()[0] for row in table[1:]] == ["ann"]
    members = json.loads(quarry("auth", "groups", "members", "readers", "--json").stdout)
    assert [m["id"] for m in members] == ["ann"]
    missing = quarry("auth", "groups", "members", "nobody", expect=1)
    assert missing.stderr.startswith("quarry: GROUP_NOT_FOUND")


def test_bash_completes_repository_branch_and_tag_names(suite, quarry, home, tmp_path):
    """The script `quarry completion bash` prints, in a real bash, completes names from the
    server the line points at, and nothing (quietly) when none answers."""
    _history(quarry, tmp_path, "complete-me")
    quarry("branch", "create", "complete-me", "feature")
    quarry("tag", "create", "complete-me", "v1", "main")
    env = quarry_env(home)
    path = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    targets = " ".join(_targets(suite))

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        script = (
            'eval "$(quarry completion bash)"; '
            f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
            f'COMP_LINE="{line}"; COMP_POINT={len(line)}; '
            '_python_argcomplete quarry; printf "%s\\n" "${COMPREPLY[@]}"'
        )
        result = subprocess.run(
            ["bash", "-c", script],
            env={**env, "PATH": path},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return sorted(w.strip() for w in result.stdout.splitlines() if w.strip())

    assert complete(f"quarry ls {targets} complete-") == ["complete-me"]
    assert complete(f"quarry commit {targets} complete-me f") == ["feature"]
    refs = [w for w in complete(f"quarry log {targets} complete-me ") if not w.startswith("-")]
    assert refs == ["HEAD", "feature", "main", "v1"]  # (with no prefix the flags come too)
    assert complete(f"quarry tag delete {targets} complete-me v") == ["v1"]
    port = free_port()
    assert complete(f"quarry ls --branch-manager 127.0.0.1:{port} complete-") == []
