"""The `quarry` command held to git's and lakectl's standard (issue 13), as a user runs it:
the real console script in a child process against the suite running in this process —
--version, "did you mean", shell completion, colours (terminals only, NO_COLOR), JSON
errors under --json, nothing on stdout before an error, flag names in error messages,
`merge --dry-run` exiting 1 on conflicts, and `cat` / `get` reading an object's bytes from
the storage namespace (local and S3)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
from pathlib import Path

import pytest

from support.processes import VENV_BIN, quarry_env
from support.suite import running_suite

ESC = "\x1b["


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    with running_suite(tmp_path_factory.mktemp("suite")) as running:
        yield running


def _targets(suite) -> list[str]:
    return [
        "--branch-manager",
        suite.targets["branch-manager"],
        "--committer",
        suite.targets["committer"],
    ]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return quarry_env(tmp_path_factory.mktemp("cli-home"))


@pytest.fixture(scope="module")
def quarry(suite, env):
    def run(
        *args: str,
        expect: int = 0,
        extra_env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(VENV_BIN / "quarry"), *args, *_targets(suite)],
            env={**env, **(extra_env or {})},
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert b"Traceback" not in result.stderr
        return result

    return run


def bare(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`quarry ARGS` with no connection options (usage-level behaviour)."""
    return subprocess.run(
        [str(VENV_BIN / "quarry"), *args], env=env, capture_output=True, text=True, timeout=60
    )


def on_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run argv with stdout and stderr on a pseudo-terminal; everything it printed."""
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env
    )
    os.close(terminal)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([controller], [], [], 60)
            if not ready:
                raise AssertionError(f"{argv} printed nothing for 60 s")
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(controller)
        child.wait(timeout=60)
    return b"".join(chunks).decode()


def _repo_with_history(suite, quarry, name: str) -> None:
    """main: `a` committed; branch f changes `a` and adds `b`; main changes `a` again."""
    quarry("repo", "create", name, suite.namespace(name))
    quarry("put", name, "main", "a", "--address", "s3://x/a0", "--checksum", "a0")
    quarry("commit", name, "main", "-m", "base")
    quarry("branch", "create", name, "f", "--source", "main")
    quarry("put", name, "f", "a", "--address", "s3://x/af", "--checksum", "af")
    quarry("put", name, "f", "b", "--address", "s3://x/bf", "--checksum", "bf")
    quarry("commit", name, "f", "-m", "feature")
    quarry("put", name, "main", "a", "--address", "s3://x/am", "--checksum", "am")
    quarry("commit", name, "main", "-m", "main change")


# ---- usage: --version, did you mean, completion -------------------------------------------


def test_version_flag(env):
    import quarry as package

    result = bare("--version", env=env)
    assert result.returncode == 0
    assert result.stdout.strip() == (
        f"quarry {package.__version__} (storage format version {package.FORMAT_VERSION})"
    )


def test_a_mistyped_command_gets_the_closest_commands_not_the_whole_usage(env):
    typo = bare("comit", "repo", "main", env=env)
    assert typo.returncode == 2
    assert "'comit' is not a quarry command" in typo.stderr
    assert "Did you mean 'commit'" in typo.stderr
    assert "usage:" not in typo.stderr and "branch-protect" not in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1

    nested = bare("repo", "craete", "x", env=env)
    assert nested.returncode == 2
    assert "'craete' is not a quarry repo command" in nested.stderr
    assert "Did you mean 'create'" in nested.stderr

    nothing_close = bare("xyzzy", env=env)
    assert nothing_close.returncode == 2
    assert "Did you mean" not in nothing_close.stderr

    # Under --json a usage error is one JSON object too.
    as_json = bare("comit", "--json", env=env)
    assert as_json.returncode == 2
    error = json.loads(as_json.stderr)["error"]
    assert error["reason"] == "USAGE" and "Did you mean 'commit'" in error["message"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_each_shell(env, shell):
    result = bare("completion", shell, env=env)
    assert result.returncode == 0, result.stderr
    assert "quarry" in result.stdout and "_ARGCOMPLETE" in result.stdout


def test_bash_completes_commands_flags_and_choices(env):
    """The script `quarry completion bash` prints, loaded into a real bash, completes."""
    path = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"

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

    assert complete("quarry com") == ["commit", "compact", "completion"]
    assert complete("quarry merge r a b --str") == ["--strategy"]
    assert complete("quarry merge r a b --strategy ") == ["dest-wins", "source-wins"]
    assert "create" in complete("quarry repo ")


# ---- colours --------------------------------------------------------------------------------


def test_colours_on_a_terminal_off_in_pipes_and_with_no_color(suite, quarry, env):
    _repo_with_history(suite, quarry, "colours")
    argv = [str(VENV_BIN / "quarry"), "diff", "colours", "main", "f", *_targets(suite)]

    coloured = on_a_terminal(argv, env)
    assert f"{ESC}33m~{ESC}0m a" in coloured  # a change, yellow
    assert f"{ESC}32m+{ESC}0m b" in coloured  # an addition, green

    assert ESC not in on_a_terminal(argv, {**env, "NO_COLOR": "1"})
    assert ESC not in quarry("diff", "colours", "main", "f").stdout.decode()

    # --color overrides either way; errors get their reason in red on stderr.
    forced = quarry("log", "colours", "main", "--oneline", "--color", "always").stdout.decode()
    assert forced.startswith(f"{ESC}33m")
    terminal_never = on_a_terminal([*argv, "--color", "never"], env)
    assert ESC not in terminal_never and "~ a" in terminal_never
    refused = quarry("repo", "show", "nope", "--color", "always", expect=1).stderr.decode()
    assert refused.startswith(f"{ESC}31;1mquarry: REPOSITORY_NOT_FOUND:{ESC}0m ")


# ---- errors ---------------------------------------------------------------------------------


def test_json_errors_are_one_object_on_stderr_and_stdout_stays_empty(quarry):
    result = quarry("repo", "show", "no-such-repo", "--json", expect=1)
    assert result.stdout == b""
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "NOT_FOUND"
    assert error["reason"] == "REPOSITORY_NOT_FOUND"
    assert "no-such-repo" in error["message"]
    assert isinstance(error["metadata"], dict)

    # A failure the CLI detects itself has the same shape.
    local = quarry("diff", "any", "main", "--json", expect=1)
    assert json.loads(local.stderr)["error"] == {
        "code": "INVALID_ARGUMENT",
        "reason": "INVALID_ARGUMENT",
        "message": "diff needs LEFT and RIGHT refs (or BRANCH --uncommitted)",
        "metadata": {},
    }


def test_a_failing_listing_prints_no_header(quarry):
    """`ls` used to print its header before the first page failed."""
    result = quarry("ls", "no-such-repo", "main", expect=1)
    assert result.stdout == b""
    assert result.stderr.decode().startswith("quarry: REPOSITORY_NOT_FOUND: ")
    result = quarry("log", "no-such-repo", "main", expect=1)
    assert result.stdout == b""


def test_error_messages_name_the_cli_flag_not_the_request_field(suite, quarry):
    _repo_with_history(suite, quarry, "hints")
    quarry("merge", "hints", "f", "main", "--strategy", "source-wins")
    refused = quarry("revert", "hints", "main", "main", expect=1).stderr.decode()
    assert refused.startswith("quarry: INVALID_PARENT: ")
    assert "--parent (1..2)" in refused and "parent_number" not in refused
    out_of_range = quarry("revert", "hints", "main", "main", "--parent", "3", expect=1)
    assert "--parent 3 is out of range" in out_of_range.stderr.decode()


# ---- merge --dry-run ---------------------------------------------------------------------------


def test_merge_dry_run_exits_1_on_conflicts_and_0_without(suite, quarry):
    _repo_with_history(suite, quarry, "dry")
    conflicted = quarry("merge", "dry", "f", "main", "--dry-run", expect=1).stdout.decode()
    assert "! a" in conflicted and "1 conflict(s)" in conflicted
    as_json = json.loads(
        quarry("merge", "dry", "f", "main", "--dry-run", "--json", expect=1).stdout
    )
    assert [c["path"] for c in as_json["conflicts"]] == ["a"]
    head = json.loads(quarry("branch", "show", "dry", "main", "--json").stdout)["commit_id"]

    quarry("branch", "create", "dry", "clean", "--source", "main")
    quarry("put", "dry", "clean", "c", "--address", "s3://x/c", "--checksum", "c")
    quarry("commit", "dry", "clean", "-m", "clean change")
    clean = quarry("merge", "dry", "clean", "main", "--dry-run").stdout.decode()
    assert "would make 1 added, 0 removed, 0 changed" in clean
    # Dry runs committed nothing.
    assert json.loads(quarry("branch", "show", "dry", "main", "--json").stdout)["commit_id"] == head


# ---- cat / get ------------------------------------------------------------------------------


def test_cat_and_get_read_the_bytes_from_the_namespace(suite, quarry, tmp_path):
    quarry("repo", "create", "bytes", suite.namespace("bytes"))
    payload = bytes(range(256)) * 40 + b"\x00tail"
    source = tmp_path / "blob.bin"
    source.write_bytes(payload)
    quarry("put", "bytes", "main", "dir/blob.bin", "--from", str(source))

    assert quarry("cat", "bytes", "main", "dir/blob.bin").stdout == payload  # staged
    commit = json.loads(quarry("commit", "bytes", "main", "-m", "blob", "--json").stdout)
    commit_id = commit["commit"]["id"]
    source.write_bytes(b"changed locally")  # the namespace holds its own copy
    assert quarry("cat", "bytes", commit_id[:12], "dir/blob.bin").stdout == payload

    work = tmp_path / "work"
    work.mkdir()
    wrote = quarry("get", "bytes", "main", "dir/blob.bin", cwd=work).stdout.decode()
    assert (work / "blob.bin").read_bytes() == payload
    assert "blob.bin" in wrote
    chosen = tmp_path / "chosen.bin"
    report = json.loads(
        quarry("get", "bytes", "main", "dir/blob.bin", "-o", str(chosen), "--json").stdout
    )
    assert report == {"path": "dir/blob.bin", "file": str(chosen), "bytes": len(payload)}
    assert chosen.read_bytes() == payload

    # A missing path: NOT_FOUND, nothing on stdout, no file.
    missing = quarry("cat", "bytes", "main", "dir/nope", expect=1)
    assert missing.stdout == b"" and b"NOT_FOUND" in missing.stderr
    quarry("get", "bytes", "main", "dir/nope", "-o", str(tmp_path / "nope"), expect=1)
    assert not (tmp_path / "nope").exists()

    # An entry whose bytes are gone: the storage's NOT_FOUND, not a traceback.
    quarry("put", "bytes", "main", "ghost", "--address", str(tmp_path / "never-written"))
    ghost = quarry("cat", "bytes", "main", "ghost", "--json", expect=1)
    assert json.loads(ghost.stderr)["error"]["reason"] == "STORAGE_OBJECT_NOT_FOUND"
    assert not (tmp_path / "never-written").exists()


def test_get_never_overwrites_a_file_without_force(suite, quarry, tmp_path):
    """Safety: `get` must never replace an existing local file unless --force is given."""
    quarry("repo", "create", "keep", suite.namespace("keep"))
    source = tmp_path / "new.txt"
    source.write_bytes(b"from the lake\n")
    quarry("put", "keep", "main", "f.txt", "--from", str(source))
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"my local work\n")

    refused = quarry("get", "keep", "main", "f.txt", "-o", str(precious), expect=1)
    assert refused.stderr.decode().startswith("quarry: FILE_EXISTS: ")
    assert precious.read_bytes() == b"my local work\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.txt", "precious.txt"]  # no temp

    quarry("get", "keep", "main", "f.txt", "-o", str(precious), "--force")
    assert precious.read_bytes() == b"from the lake\n"


def test_cat_reads_from_an_s3_namespace(tmp_path, moto_endpoint, s3_bucket):
    with running_suite(tmp_path / "suite", s3_endpoint_url=moto_endpoint) as s3_suite:
        env = quarry_env(
            tmp_path / "home",
            QUARRY_S3_ENDPOINT_URL=moto_endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )

        def run(*args: str) -> bytes:
            result = subprocess.run(
                [str(VENV_BIN / "quarry"), *args, *_targets(s3_suite)],
                env=env,
                capture_output=True,
                timeout=60,
            )
            assert result.returncode == 0, (args, result.stderr)
            return result.stdout

        payload = b"parquet-ish\x00\x01" * 100
        (tmp_path / "part.bin").write_bytes(payload)
        run("repo", "create", "s3cat", f"s3://{s3_bucket}/lake/s3cat")
        run("put", "s3cat", "main", "tables/part.bin", "--from", str(tmp_path / "part.bin"))
        entry = json.loads(run("stat", "s3cat", "main", "tables/part.bin", "--json"))
        assert entry["physical_address"].startswith(f"s3://{s3_bucket}/lake/s3cat/data/")
        (tmp_path / "part.bin").unlink()
        assert run("cat", "s3cat", "main", "tables/part.bin") == payload


def test_a_mistyped_flag_gets_the_closest_flag_of_its_command(env):
    result = bare("merge", "repo", "f", "main", "--dryrun", env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "quarry: error: unrecognized arguments: --dryrun. See 'quarry merge --help'. "
        "Did you mean '--dry-run'?"
    )
    nested = bare("repo", "create", "r", "/abs", "--default-brnch", "trunk", env=env)
    assert "Did you mean '--default-branch'?" in nested.stderr
    assert "usage:" not in nested.stderr


def test_the_confirmation_prompt_shows_while_stdout_is_held(suite, quarry, env):
    """stdout is held until a command succeeds, so questions go to stderr (a regression
    here would leave the user answering an invisible prompt)."""
    quarry("repo", "create", "asked", suite.namespace("asked"))
    argv = [str(VENV_BIN / "quarry"), "repo", "delete", "asked", *_targets(suite)]
    controller, terminal = pty.openpty()
    child = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    seen = b""
    try:
        while b"[y/N]" not in seen:
            ready, _, _ = select.select([controller], [], [], 60)
            assert ready, f"no prompt within 60 s: {seen!r}"
            seen += os.read(controller, 4096)
        os.write(controller, b"n\n")
        child.wait(timeout=60)
        with contextlib.suppress(OSError):
            while chunk := os.read(controller, 4096):
                seen += chunk
    finally:
        os.close(controller)
        if child.poll() is None:
            child.kill()
    assert child.returncode == 1
    assert b"CANCELLED" in seen
    quarry("repo", "show", "asked")  # still there


def test_gc_without_a_usable_java_is_a_clear_precondition_not_internal(suite, quarry, tmp_path):
    """The machine's mistake (no Java where JAVA_HOME points) is FAILED_PRECONDITION /
    SPARK_UNAVAILABLE naming JAVA_HOME, never INTERNAL or a traceback."""
    quarry("repo", "create", "nojava", suite.namespace("nojava"))
    result = quarry(
        "gc",
        "run",
        "nojava",
        "--json",
        expect=1,
        extra_env={"JAVA_HOME": str(tmp_path / "no-java-here")},
    )
    assert result.stdout == b""
    error = json.loads(result.stderr.decode().strip().splitlines()[-1])["error"]
    assert (error["code"], error["reason"]) == ("FAILED_PRECONDITION", "SPARK_UNAVAILABLE")
    assert "JAVA_HOME" in error["message"]
    assert error["metadata"]["java_home"] == str(tmp_path / "no-java-here")
