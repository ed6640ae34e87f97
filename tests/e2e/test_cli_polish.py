"""The `quarry` command held to git's and lakectl's standard (issue 13), as a user runs it,
against the suite running in this process (the commands in process as a child would see
them, support.cli; on a terminal, through a pipe and under a memory meter as real
processes) —
--version, "did you mean", shell completion, colours (terminals only, NO_COLOR), JSON
errors under --json, nothing on stdout before an error, flag names in error messages,
`merge --dry-run` exiting 1 on conflicts, and `cat` / `get` reading an object's bytes from
the storage namespace (local and S3)."""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import io
import json
import os
import pty
import random
import select
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import run_quarry
from support.processes import VENV_BIN, quarry_env
from support.suite import running_suite, suite_fixture

ESC = "\x1b["


suite = suite_fixture()


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
        child: bool = False,
    ) -> subprocess.CompletedProcess:
        result = run_quarry(
            [*args, *_targets(suite)],
            {**env, **(extra_env or {})},
            cwd=cwd,
            text=False,
            child=child,
        )
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert b"Traceback" not in result.stderr
        return result

    return run


def bare(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`quarry ARGS` with no connection options (usage-level behaviour)."""
    return run_quarry(args, env)


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


def test_a_lakectl_habit_gets_quarrys_way_of_saying_it(env):
    for typed, said in [
        (["fs", "ls", "r", "main"], "quarry ls, stat, cat, get, put, rm"),
        (["branch", "reset", "r", "main"], "`quarry discard`"),
        (["branch", "revert", "r", "main"], "`quarry revert`"),
        (["log", "r", "main", "--amount", "2"], "Did you mean '-n'?"),
        (["log", "r", "main", "--objects", "a"], "Did you mean '--path'?"),
    ]:
        result = bare(*typed, env=env)
        assert result.returncode == 2 and said in result.stderr, (typed, result.stderr)
    # A habit this command has no flag for gets no merely similar one.
    limit = bare("ls", "r", "main", "--limit", "3", env=env)
    assert limit.returncode == 2 and "Did you mean" not in limit.stderr


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
    local = quarry("diff", "any", "main", "--json", expect=2)  # a usage error: exit 2
    assert json.loads(local.stderr)["error"] == {
        "code": "INVALID_ARGUMENT",
        "reason": "USAGE",
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


def test_get_writes_through_links_refuses_special_files_and_takes_dash_for_stdout(
    suite, quarry, tmp_path
):
    """--force replaces the file a link points to, never the link (as root, `-o /dev/stdout
    --force` once replaced the system's /dev/stdout with a file); a pipe or a device is
    refused, nothing replaced; `-o -` is stdout; a new file gets the umask's mode, a
    replaced one keeps its own (mkstemp's 0600 leaked through)."""
    import os
    import stat

    quarry("repo", "create", "links", suite.namespace("links"))
    source = tmp_path / "new.txt"
    source.write_bytes(b"from the lake\n")
    quarry("put", "links", "main", "f.txt", "--from", str(source))
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    link.symlink_to(target)
    quarry("get", "links", "main", "f.txt", "-o", str(link), "--force")
    assert link.is_symlink() and target.read_bytes() == b"from the lake\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    refused = quarry("get", "links", "main", "f.txt", "-o", str(fifo), "--force", expect=1)
    assert "NOT_A_REGULAR_FILE" in refused.stderr.decode()
    assert stat.S_ISFIFO(fifo.stat().st_mode)

    assert quarry("get", "links", "main", "f.txt", "-o", "-").stdout == b"from the lake\n"
    fresh = tmp_path / "fresh.txt"
    quarry("get", "links", "main", "f.txt", "-o", str(fresh))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


# ---- cat / get stream, and refuse bytes that differ from the entry ---------------------------

MiB = 1 << 20
LARGE_OBJECT_BYTES = 64 * MiB


def _write_random(path: Path, size: int, seed: int) -> None:
    generator = random.Random(seed)
    with open(path, "wb") as out:
        for start in range(0, size, MiB):
            out.write(generator.randbytes(min(MiB, size - start)))


# Runs argv (after the report file's path) and writes its peak resident memory there. The
# measuring happens in this small process, not in the test process: a child forked from the
# test process would count the test process's memory, held at the fork, as its own peak.
_MEASURE = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as report:
    report.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def run_measured(argv: list[str], env: dict[str, str], stdout: Path) -> tuple[int, bytes, int]:
    """Run argv with stdout into a file: its exit code, stderr and peak resident memory in
    bytes (Linux reports ru_maxrss in kilobytes)."""
    report = stdout.with_name(stdout.name + ".maxrss")
    with open(stdout, "wb") as out:
        result = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(report), *argv],
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
    return result.returncode, result.stderr, int(report.read_text()) * 1024


def test_cat_and_get_stream_a_large_object_without_holding_it(suite, quarry, env, tmp_path):
    """A 64 MiB object through `quarry cat` and `quarry get` as real processes: the bytes
    arrive whole, and the process's peak memory grows far less than the object over the
    same command reading a 100-byte object (holding it would add at least 64 MiB)."""
    quarry("repo", "create", "large", suite.namespace("large"))
    large, small = tmp_path / "large.bin", tmp_path / "small.bin"
    _write_random(large, LARGE_OBJECT_BYTES, seed=1)
    small.write_bytes(b"s" * 100)
    quarry("put", "large", "main", "large.bin", "--from", str(large))
    quarry("put", "large", "main", "small.bin", "--from", str(small))
    quarry("commit", "large", "main", "-m", "large and small")
    binary = str(VENV_BIN / "quarry")

    def peak(*args: str, stdout: Path) -> int:
        code, err, rss = run_measured([binary, *args, *_targets(suite)], env, stdout)
        assert code == 0, (args, err)
        assert err == b""
        return rss

    for command in ("cat", "get"):
        outputs = {name: tmp_path / f"{command}-{name}" for name in ("large", "small")}
        peaks = {}
        for name, written in outputs.items():
            extra = ("-o", str(written)) if command == "get" else ()
            report = tmp_path / f"{command}-{name}.stdout"
            into = report if command == "get" else written
            peaks[name] = peak(command, "large", "main", f"{name}.bin", *extra, stdout=into)
        assert filecmp.cmp(outputs["large"], large, shallow=False), command
        assert outputs["small"].read_bytes() == small.read_bytes()
        grew = peaks["large"] - peaks["small"]
        assert grew < LARGE_OBJECT_BYTES // 4, (command, peaks)


def test_put_from_streams_a_large_file_without_holding_it(suite, quarry, env, tmp_path):
    """`quarry put --from` of a 64 MiB file as a real process: its peak memory grows far
    less than the file over the same command uploading a 100-byte file (reading it whole
    would add at least 64 MiB); the entry records the file's size and SHA-256, and `quarry
    get` gives back the same bytes."""
    quarry("repo", "create", "upload", suite.namespace("upload"))
    large, small = tmp_path / "large.bin", tmp_path / "small.bin"
    _write_random(large, LARGE_OBJECT_BYTES, seed=3)
    small.write_bytes(b"s" * 100)
    binary = str(VENV_BIN / "quarry")
    peaks = {}
    for name, source in (("large", large), ("small", small)):
        code, err, peaks[name] = run_measured(
            [binary, "put", "upload", "main", source.name, "--from", str(source), *_targets(suite)],
            env,
            tmp_path / f"put-{name}.stdout",
        )
        assert code == 0 and err == b"", (name, err)
    grew = peaks["large"] - peaks["small"]
    assert grew < LARGE_OBJECT_BYTES // 4, peaks

    entry = json.loads(quarry("stat", "upload", "main", "large.bin", "--json").stdout)
    digest = hashlib.sha256()
    with open(large, "rb") as fh:
        while chunk := fh.read(MiB):
            digest.update(chunk)
    assert entry["checksum"] == digest.hexdigest()
    assert int(entry["size_bytes"]) == LARGE_OBJECT_BYTES
    back = tmp_path / "back.bin"
    quarry("get", "upload", "main", "large.bin", "-o", str(back))
    assert filecmp.cmp(back, large, shallow=False)


@pytest.mark.parametrize("change", ["grows", "rewritten-in-place"])
def test_put_from_refuses_a_file_that_changes_while_uploaded(
    suite, quarry, env, tmp_path, monkeypatch, change
):
    """Safety: an entry must never record bytes other than the ones uploaded. The file
    changes while its bytes are read (after the first piece): it grows, or its last bytes
    are rewritten in place (same size, a new mtime). `quarry put --from` fails with
    LOCAL_FILE_CHANGED (ABORTED) and stages nothing; the uploaded object stays unreferenced.
    Run in-process so the upload's reads can be interleaved with a write."""
    from quarry.blob.local import LocalBlobStore
    from quarry.cli.main import main as quarry_main

    repo = f"changing-{change}"
    quarry("repo", "create", repo, suite.namespace(repo))
    source = tmp_path / "growing.bin"
    _write_random(source, 3 * MiB, seed=4)
    put_stream = LocalBlobStore.put_stream

    class AppendingSource:
        """The opened file, with another writer appending to it after the first read."""

        def __init__(self, raw):
            self.raw, self.reads = raw, 0

        def read(self, size=-1, /):
            self.reads += 1
            if self.reads == 2 and change == "grows":
                with open(source, "ab") as writer:
                    writer.write(b"appended meanwhile")
            elif self.reads == 2:
                mtime = os.stat(source).st_mtime_ns
                with open(source, "r+b") as writer:
                    writer.seek(-8, os.SEEK_END)
                    writer.write(b"rewrite!")
                os.utime(source, ns=(mtime, mtime + 1_000_000_000))  # a coarse clock too
            return self.raw.read(size)

    monkeypatch.setattr(
        LocalBlobStore,
        "put_stream",
        lambda store, key, raw: put_stream(store, key, AppendingSource(raw)),
    )
    for key in [k for k in os.environ if k.startswith(("QUARRY_", "OTEL_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = quarry_main(
            ["put", repo, "main", "g.bin", "--from", str(source), "--json", *_targets(suite)]
        )
    assert code == 1, stderr.getvalue()
    failure = json.loads(stderr.getvalue())["error"]
    assert failure["reason"] == "LOCAL_FILE_CHANGED" and failure["code"] == "ABORTED", failure
    assert "growing.bin" in failure["message"]
    # Nothing staged; the bytes uploaded stay in the namespace, unreferenced.
    missing = quarry("stat", repo, "main", "g.bin", "--json", expect=1)
    assert json.loads(missing.stderr)["error"]["code"] == "NOT_FOUND"
    assert json.loads(quarry("ls", repo, "main", "--json").stdout)["entries"] == []
    uploaded = list(Path(suite.namespace(repo)).joinpath("data").iterdir())
    assert len(uploaded) == 1


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_cat_into_a_closed_pipe_is_a_success(suite, quarry, env, tmp_path, buffered):
    """`quarry cat ... | head -c 10`: head leaves after 10 bytes of a 4 MiB object; quarry
    exits 0 with nothing on stderr, like `cat | head` — with stdout buffered (a user's
    shell) or not (PYTHONUNBUFFERED, as the other tests run it)."""
    name = f"piped-{buffered}".lower()
    quarry("repo", "create", name, suite.namespace(name))
    source = tmp_path / "piped.bin"
    _write_random(source, 4 * MiB, seed=2)
    quarry("put", name, "main", "piped.bin", "--from", str(source))
    if buffered:
        env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    argv = " ".join(
        shlex.quote(part)
        for part in [
            str(VENV_BIN / "quarry"),
            "cat",
            name,
            "main",
            "piped.bin",
            *_targets(suite),
        ]
    )
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {argv} | head -c 10"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == source.read_bytes()[:10]
    assert result.stderr == b""


def _json_error(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stderr.decode().strip().splitlines()[-1])["error"]


def test_get_and_cat_refuse_an_object_that_differs_from_its_entry(suite, quarry, tmp_path):
    """Safety: `get` must never leave a FILE whose bytes differ from the entry (nor replace
    an existing one with them, even with --force), and `cat` must not exit 0 on them. The
    object in the namespace is overwritten after the commit: same size other bytes
    (CHECKSUM_MISMATCH), longer and shorter (OBJECT_CHANGED); all DATA_LOSS."""
    quarry("repo", "create", "tamper", suite.namespace("tamper"))
    source = tmp_path / "t.bin"
    _write_random(source, 3 * MiB + 17, seed=3)  # several chunks
    original = source.read_bytes()
    quarry("put", "tamper", "main", "t.bin", "--from", str(source))
    quarry("commit", "tamper", "main", "-m", "t")
    entry = json.loads(quarry("stat", "tamper", "main", "t.bin", "--json").stdout)
    stored = Path(entry["physical_address"])
    assert stored.read_bytes() == original

    flipped = bytearray(original)
    flipped[2 * MiB + 5] ^= 0xFF
    cases = {
        "CHECKSUM_MISMATCH": bytes(flipped),
        "OBJECT_CHANGED": original + b"more",
    }
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    precious = downloads / "precious.bin"
    for reason, tampered in [*cases.items(), ("OBJECT_CHANGED", original[:-1])]:
        stored.write_bytes(tampered)
        target = downloads / "t.bin"
        refused = quarry("get", "tamper", "main", "t.bin", "-o", str(target), "--json", expect=1)
        error = _json_error(refused)
        assert (error["code"], error["reason"]) == ("DATA_LOSS", reason), error
        assert error["metadata"]["physical_address"] == str(stored)
        assert refused.stdout == b""
        assert not target.exists()
        precious.write_bytes(b"my local work")
        quarry("get", "tamper", "main", "t.bin", "-o", str(precious), "--force", expect=1)
        assert precious.read_bytes() == b"my local work"
        assert sorted(p.name for p in downloads.iterdir()) == ["precious.bin"]  # no temp file

        # cat has written the bytes as it read them, all but the last chunk, held until
        # the check, which fails it: never a whole object of other bytes.
        shown = quarry("cat", "tamper", "main", "t.bin", expect=1)
        assert tampered.startswith(shown.stdout) and len(shown.stdout) < len(original)
        assert shown.stderr.decode().startswith(f"quarry: {reason}: ")
        assert "changed after the entry was recorded" in shown.stderr.decode()

    stored.write_bytes(original)  # the entry's own bytes pass again
    quarry("get", "tamper", "main", "t.bin", "-o", str(downloads / "t.bin"))
    assert (downloads / "t.bin").read_bytes() == original
    assert quarry("cat", "tamper", "main", "t.bin").stdout == original

    # Gone: NOT_FOUND, no file, no temp file.
    stored.unlink()
    (downloads / "t.bin").unlink()
    gone = quarry(
        "get", "tamper", "main", "t.bin", "-o", str(downloads / "t.bin"), "--json", expect=1
    )
    assert (_json_error(gone)["code"], _json_error(gone)["reason"]) == (
        "NOT_FOUND",
        "STORAGE_OBJECT_NOT_FOUND",
    )
    assert sorted(p.name for p in downloads.iterdir()) == ["precious.bin"]


def test_a_checksum_that_is_not_a_sha256_is_checked_by_size_only(suite, quarry, tmp_path):
    """An entry staged with --address and an S3-ETag-like checksum: its bytes cannot be
    hashed to that form, so only the size is checked (as `quarry get --help` says)."""
    quarry("repo", "create", "etag", suite.namespace("etag"))
    imported = tmp_path / "imported.bin"
    imported.write_bytes(b"imported bytes\n")
    etag = '"9b2cf535f27731c974343645a3985328-2"'
    quarry(
        "put", "etag", "main", "i.bin", "--address", str(imported), "--size", "15",
        "--checksum", etag,
    )  # fmt: skip
    assert quarry("cat", "etag", "main", "i.bin").stdout == b"imported bytes\n"
    imported.write_bytes(b"other  bytes!!\n")  # same size: not detectable by size
    assert quarry("cat", "etag", "main", "i.bin").stdout == b"other  bytes!!\n"
    imported.write_bytes(b"longer bytes now\n")
    wrong = quarry("get", "etag", "main", "i.bin", "-o", str(tmp_path / "out"), "--json", expect=1)
    assert _json_error(wrong)["reason"] == "OBJECT_CHANGED"
    assert _json_error(wrong)["metadata"]["expected_size"] == "15"
    assert not (tmp_path / "out").exists()


def test_cat_reads_from_an_s3_namespace(tmp_path, moto_endpoint, s3_bucket):
    with running_suite(tmp_path / "suite", s3_endpoint_url=moto_endpoint) as s3_suite:
        env = quarry_env(
            tmp_path / "home",
            QUARRY_S3_ENDPOINT_URL=moto_endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )

        def run(*args: str, expect: int = 0) -> bytes:
            result = run_quarry([*args, *_targets(s3_suite)], env, text=False)
            assert result.returncode == expect, (args, result.stderr)
            return result.stderr if expect else result.stdout

        payload = b"parquet-ish\x00\x01" * 100
        (tmp_path / "part.bin").write_bytes(payload)
        run("repo", "create", "s3cat", f"s3://{s3_bucket}/lake/s3cat")
        run("put", "s3cat", "main", "tables/part.bin", "--from", str(tmp_path / "part.bin"))
        entry = json.loads(run("stat", "s3cat", "main", "tables/part.bin", "--json"))
        assert entry["physical_address"].startswith(f"s3://{s3_bucket}/lake/s3cat/data/")
        (tmp_path / "part.bin").unlink()
        assert run("cat", "s3cat", "main", "tables/part.bin") == payload

        # Streamed from get_object's body in chunks, and checked against the entry.
        large = tmp_path / "large.bin"
        _write_random(large, 3 * MiB + 5, seed=4)
        run("put", "s3cat", "main", "large.bin", "--from", str(large))
        assert run("cat", "s3cat", "main", "large.bin") == large.read_bytes()
        run("get", "s3cat", "main", "large.bin", "-o", str(tmp_path / "got.bin"))
        assert filecmp.cmp(tmp_path / "got.bin", large, shallow=False)

        address = json.loads(run("stat", "s3cat", "main", "large.bin", "--json"))
        bucket, _, key = address["physical_address"].removeprefix("s3://").partition("/")
        tampered = bytearray(large.read_bytes())
        tampered[-1] ^= 0x01
        _s3_client(moto_endpoint).put_object(Bucket=bucket, Key=key, Body=bytes(tampered))
        refused = run("get", "s3cat", "main", "large.bin", "-o", str(tmp_path / "bad"), expect=1)
        assert refused.decode().startswith("quarry: CHECKSUM_MISMATCH: ")
        assert not (tmp_path / "bad").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad.")]  # no temp


def _s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(s3={"addressing_style": "path"}),
    )


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
        child=True,  # its own JVM to start (in this worker, Spark may be running already)
    )
    assert result.stdout == b""
    error = json.loads(result.stderr.decode().strip().splitlines()[-1])["error"]
    assert (error["code"], error["reason"]) == ("FAILED_PRECONDITION", "SPARK_UNAVAILABLE")
    assert "JAVA_HOME" in error["message"]
    assert error["metadata"]["java_home"] == str(tmp_path / "no-java-here")


def test_server_text_cannot_drive_the_terminal(suite, quarry):
    """Names, messages and metadata come from anyone who may write: their control
    characters (an ESC sequence that clears the screen, a CR that overwrites the line) and
    direction overrides are shown escaped in human output; --json keeps them, escaped as
    JSON does."""
    evil = "evil\x1b[2J\rname\u202etxt.exe"
    with suite.client() as client:
        client.create_repository("terminal", suite.namespace("terminal"))
        client.put_object("terminal", "main", path=evil, physical_address="s3://b/x", size_bytes=1)
        client.commit("terminal", "main", "msg \x1b]0;title\x07 end", metadata={"k": "\x1b[31m"})
    for args in (
        ("ls", "terminal", "main"),
        ("log", "terminal", "main"),
        ("log", "terminal", "main", "--oneline"),
        ("diff", "terminal", "main~1", "main"),
    ):
        out = quarry(*args).stdout.decode()
        assert "\x1b" not in out and "\r" not in out and "\u202e" not in out, args
        assert "\\x1b" in out, (args, out)
    as_json = quarry("ls", "terminal", "main", "--json").stdout.decode()
    assert json.loads(as_json)["entries"][0]["path"] == evil


def test_rm_recursive_removes_the_folder_named_never_its_lookalike_siblings(
    suite, quarry, tmp_path
):
    """Safety: `rm -r t` is the folder `t/` (as `ls` shows it): it once matched the text,
    and removed `tables/` and `tmp/` too (`rm -r events` took `events_raw/`)."""
    quarry("repo", "create", "folders", suite.namespace("folders"))
    for path in ("t/y", "t/deeper/w", "tables/x", "tmp/z", "t"):
        quarry("put", "folders", "main", path, "--address", f"s3://b/{path}", "--size", "1")
    for everything in ("", "/"):  # an unset shell variable would name the whole branch
        assert (
            "FOLDER" in quarry("rm", "folders", "main", "-r", everything, expect=2).stderr.decode()
        )
    out = quarry("rm", "folders", "main", "-r", "t", "--json").stdout
    assert json.loads(out) == {"removed": 2, "requested": 2}
    left = json.loads(quarry("ls", "folders", "main", "--recursive", "--json").stdout)
    assert sorted(e["path"] for e in left["entries"]) == ["t", "tables/x", "tmp/z"]
    # -r is a switch, as in `ls -r`, `get -r` and git: the habit's order `rm -r REPO BRANCH
    # FOLDER...` (it once took REPO for the folder and BRANCH for the repository), and
    # several folders at once.
    assert "FOLDER" in quarry("rm", "-r", "folders", "main", expect=2).stderr.decode()
    out = quarry("rm", "-r", "folders", "main", "tables", "tmp/", "--json").stdout
    assert json.loads(out) == {"removed": 2, "requested": 2}
    left = json.loads(quarry("ls", "folders", "main", "--recursive", "--json").stdout)
    assert [e["path"] for e in left["entries"]] == ["t"]


def test_put_from_a_directory_names_what_it_skips(suite, quarry, tmp_path):
    """A broken link or a pipe in a dataset directory is not uploaded, and is said to be
    skipped on stderr (it was silent: a broken link usually means missing data)."""
    import os

    quarry("repo", "create", "skips", suite.namespace("skips"))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.csv").write_bytes(b"a\n")
    (tree / "broken").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tree / "pipe")
    done = quarry("put", "skips", "main", "t/", "--from", str(tree))
    assert "Uploaded 1 file" in done.stdout.decode()
    said = done.stderr.decode()
    assert "skipping 2 not regular files" in said
    assert "broken (a broken link)" in said and "pipe (not a regular file)" in said


def test_log_by_path_prefix_and_time(suite, quarry):
    """Who changed this table, and when (lakectl log --objects / --prefixes / --since)."""
    quarry("repo", "create", "history", suite.namespace("history"))
    for path, message in (("t/a/1", "a"), ("t/b/1", "b"), ("t/a/2", "a again")):
        quarry("put", "history", "main", path, "--address", f"s3://b/{path}", "--size", "1")
        quarry("commit", "history", "main", "-m", message)

    def log(*flags: str) -> list[str]:
        out = quarry("log", "history", "main", "--json", *flags).stdout
        return [c["message"] for c in json.loads(out)]

    assert log("--prefix", "t/a/") == ["a again", "a"]
    assert log("--path", "t/b/1", "--path", "t/a/2") == ["a again", "b"]
    assert log("--prefix", "t/", "-n", "2") == ["a again", "b"]
    assert log("--since", "1d", "--prefix", "t/a/") == ["a again", "a"]
    assert log("--since", "2999-01-01") == []
    bad = quarry("log", "history", "main", "--since", "yesterday-ish", expect=2)
    assert "not a date or time" in bad.stderr.decode()
    for far in ("9999-12-31T23:59:59-12:00", "0001-01-01"):  # it was INTERNAL
        assert "1970" in quarry("log", "history", "main", "--since", far, expect=2).stderr.decode()
    assert log("--since", "99999999d", "--prefix", "t/b/") == ["b"]  # an age past 1970: all


def test_get_recursive_downloads_a_folder_and_never_writes_outside_the_directory(
    suite, quarry, tmp_path
):
    """lakectl fs download -r: every object under the folder, at its path below it, each
    checked; an object whose path is no file name (`..` segments: paths are writers'
    strings) is skipped and named, never written outside the directory."""
    quarry("repo", "create", "folder", suite.namespace("folder"))
    tree = tmp_path / "tree"
    (tree / "deeper").mkdir(parents=True)
    (tree / "a.csv").write_bytes(b"a\n")
    (tree / "deeper" / "b.csv").write_bytes(b"bb\n")
    quarry("put", "folder", "main", "t/", "--from", str(tree))
    quarry("put", "folder", "main", "tables/x", "--from", str(tree / "a.csv"))  # a lookalike
    escape = tmp_path / "escaped"
    quarry("put", "folder", "main", "t/../../escaped", "--from", str(tree / "a.csv"))
    out = tmp_path / "out"
    done = quarry("get", "folder", "main", "t", "-r", "-o", str(out), "--json")
    assert json.loads(done.stdout) == {
        "folder": "t/",
        "directory": str(out),
        "files": 2,
        "bytes": 5,
    }
    assert (out / "a.csv").read_bytes() == b"a\n"
    assert (out / "deeper" / "b.csv").read_bytes() == b"bb\n"
    assert sorted(p.name for p in out.rglob("*")) == ["a.csv", "b.csv", "deeper"]
    assert not escape.exists() and "t/../../escaped" in done.stderr.decode()
    again = quarry("get", "folder", "main", "t", "-r", "-o", str(out), expect=1)
    assert "FILE_EXISTS" in again.stderr.decode()
    quarry("get", "folder", "main", "t", "-r", "-o", str(out), "--force")
    # A link inside DIR never carries a write out of it (a folder link, a dangling file
    # link); a path that is both a file and a folder is skipped and named.
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "deeper").symlink_to(outside)
    (linked / "a.csv").symlink_to(tmp_path / "nowhere.csv")
    quarry("put", "folder", "main", "t/a.csv/inner", "--from", str(tree / "a.csv"))
    done = quarry("get", "folder", "main", "t", "-r", "-o", str(linked), "--force")
    said = done.stderr.decode()
    assert list(outside.iterdir()) == [] and not (tmp_path / "nowhere.csv").exists()
    assert "t/deeper/b.csv" in said and "a link leads out" in said
    assert "t/a.csv/inner" in said
    missing = quarry("get", "folder", "main", "nothing", "-r", "-o", str(tmp_path / "n"), expect=1)
    assert "NOTHING_TO_DOWNLOAD" in missing.stderr.decode()


def test_a_commit_says_why_and_leaves_quarrys_own_metadata_alone(suite, quarry):
    """As lakectl: an empty message needs --allow-empty-message; `quarry.` metadata keys
    are the ones Quarry writes (merge bases, reverts), not a user's to set."""
    quarry("repo", "create", "hygiene", suite.namespace("hygiene"))
    quarry("put", "hygiene", "main", "a", "--address", "s3://b/a", "--size", "1")
    empty = quarry("commit", "hygiene", "main", "-m", " ", expect=2)
    assert "--allow-empty-message" in empty.stderr.decode()
    own = quarry("commit", "hygiene", "main", "-m", "m", "--meta", "quarry.revert=x", expect=2)
    assert "quarry.revert" in own.stderr.decode()
    quarry("commit", "hygiene", "main", "--allow-empty-message", "--meta", "k=v")  # no -m


def test_quarry_uris_stand_for_repo_ref_and_path(suite, quarry):
    """lakectl's `lakefs://` habit: quarry://REPO/REF[/PATH] wherever REPO REF [PATH] go."""
    quarry("repo", "create", "uris", suite.namespace("uris"))
    quarry("put", "uris", "main", "t/a", "--address", "s3://b/a", "--size", "1")
    quarry("commit", "quarry://uris/main", "-m", "one")
    quarry("branch", "create", "uris", "dev", "--source", "main")
    quarry("put", "quarry://uris/dev/t/b", "--address", "s3://b/b", "--size", "2")
    quarry("commit", "uris", "dev", "-m", "two")
    listed = json.loads(quarry("ls", "quarry://uris/dev/t/", "--json").stdout)
    assert [e["path"] for e in listed["entries"]] == ["t/a", "t/b"]
    assert json.loads(quarry("stat", "quarry://uris/dev/t/b", "--json").stdout)["size_bytes"] == 2
    diff = json.loads(quarry("diff", "quarry://uris/main", "quarry://uris/dev", "--json").stdout)
    assert [(c["type"], c["path"]) for c in diff] == [("added", "t/b")]
    mixed = quarry("diff", "quarry://uris/main", "quarry://other/dev", expect=2)
    assert "names repository 'other'" in mixed.stderr.decode()
    bad = quarry("ls", "quarry://uris", expect=2)
    assert "quarry://REPO/REF[/PATH]" in bad.stderr.decode()
    # Safety: a later URI naming another branch is refused where the command works on one
    # (it once removed main's path from dev).
    two = quarry("rm", "quarry://uris/dev/t/a", "quarry://uris/main/t/a", expect=2)
    assert "names ref 'main'" in two.stderr.decode()
    assert json.loads(quarry("stat", "uris", "main", "t/a", "--json").stdout)["path"] == "t/a"
    # A URI whose path starts with '-' would be read as an option (`-r`: remove folders).
    dashed = quarry("rm", "quarry://uris/dev/t/a", "quarry://uris/dev/-r", expect=2)
    assert "goes after `--`" in dashed.stderr.decode()
    assert json.loads(quarry("stat", "uris", "dev", "t/a", "--json").stdout)["path"] == "t/a"
    # lakectl's own form of a recursive removal; a message that looks like a URI stays one.
    quarry("rm", "-r", "quarry://uris/dev/t")
    quarry("commit", "quarry://uris/dev", "-m", "quarry://not/a/uri")
    (head,) = json.loads(quarry("log", "quarry://uris/dev/t/", "-n", "1", "--json").stdout)
    assert head["message"] == "quarry://not/a/uri"
    assert json.loads(quarry("ls", "quarry://uris/dev/", "--json").stdout)["entries"] == []
