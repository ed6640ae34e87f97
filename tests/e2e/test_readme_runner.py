"""The README runs top to bottom as written (issue 13).

The suite is started as `make run` starts it — `quarry up` with a fresh QUARRY_HOME and no
credentials given (it creates the admin and stores them, as on a first start) — and every
README block marked `<!-- readme-runner: run -->` (tests/support/readme.py) runs in README
order: shell blocks in ONE bash process from the repository root (so `source
.venv/bin/activate` and the variables a block sets carry over to the next, as in a
terminal), with `set -e` (a failing command fails its block); Python blocks with the venv's
python. A failure names the README line of the command (shell) or of the traceback's line
(Python).

Two substitutions keep the run isolated, and nothing else changes: the README's fixed
addresses `127.0.0.1:7401`..`7406` become the free ports this suite listens on (tests bind
free ports; the same QUARRY_*_ADDRESS settings are given, as the defaults are on a developer
machine), and `/tmp/lake` becomes a fresh directory.

The Spark block runs too, in its place: a complete script (a local[2] session, a write,
a tag, a read), about 35 s of the run on a shared 2-core machine.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import readme
from support.processes import REPO_ROOT, VENV_BIN, free_port

pytestmark = pytest.mark.timeout(900)

SERVICES = (
    "kv-gateway",
    "branch-manager",
    "committer",
    "compactor-sensor",
    "range-writer",
    "s3-gateway",
    "console",
)
README_PORTS = {  # the README's addresses: the defaults of QUARRY_*_PORT
    "kv-gateway": 7401,
    "branch-manager": 7402,
    "committer": 7403,
    "compactor-sensor": 7404,
    "range-writer": 7405,
    "s3-gateway": 7406,
    "console": 7407,
}
BLOCK_TIMEOUT = 300.0
_DONE = "__README_BLOCK_DONE__"
_FAILED = "__README_BLOCK_FAILED__"


@dataclass
class ReadmeSuite:
    env: dict[str, str]
    ports: dict[str, int]
    lake: Path
    work: Path

    def adapt(self, code: str) -> str:
        """The block as this run executes it: the README's addresses and /tmp/lake mapped."""
        for name, port in README_PORTS.items():
            code = code.replace(f"127.0.0.1:{port}", f"127.0.0.1:{self.ports[name]}")
        return code.replace("/tmp/lake", str(self.lake))


def _environment(home: Path, ports: dict[str, int]) -> dict[str, str]:
    """A newcomer's environment: no QUARRY_* or OTEL_* settings, no credentials (the test
    process's own come from tests/conftest.py), except the ports of this isolated suite."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("QUARRY_", "OTEL_", "VIRTUAL_ENV"))
    }
    env.update(QUARRY_HOME=str(home), QUARRY_METRICS_BASE_PORT="0", PYTHONUNBUFFERED="1")
    for name, port in ports.items():
        key = name.upper().replace("-", "_")
        env[f"QUARRY_{key}_PORT"] = str(port)
        env[f"QUARRY_{key}_ADDRESS"] = f"127.0.0.1:{port}"
    return env


@pytest.fixture(scope="module")
def readme_suite(tmp_path_factory) -> Iterator[ReadmeSuite]:
    root = tmp_path_factory.mktemp("readme")
    ports = {name: free_port() for name in SERVICES}
    env = _environment(root / "home", ports)
    up = subprocess.Popen(
        [str(VENV_BIN / "quarry"), "up"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            banner.append(line)
            if "Press Ctrl-C" in line:
                break
        else:
            raise AssertionError("quarry up did not come up:\n" + "".join(banner))
        assert up.poll() is None, "quarry up exited:\n" + "".join(banner)
        assert (root / "home" / "credentials.json").exists(), "".join(banner)
        # Keep draining its output so it never blocks on a full pipe.
        threading.Thread(target=up.stdout.read, daemon=True).start()
        lake = root / "lake"
        lake.mkdir()
        yield ReadmeSuite(env=env, ports=ports, lake=lake, work=root)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()


class Shell:
    """One bash for every shell block, as one terminal is for a reader."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.work = work
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._send("set -e\n")

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, text: str) -> None:
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def run(self, block: readme.Block, code: str) -> None:
        script = self.work / f"block-{block.line}.sh"
        script.write_text(code)
        self._send(
            # Markers on lines of their own, even after output with no final newline.
            f"trap 'printf \"\\n{_FAILED} %s\\n\" $LINENO' ERR\n"
            f"source {script}\n"
            "trap - ERR\n"
            f"printf '\\n{_DONE}\\n'\n"
        )
        output: list[str] = []
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(
                    f"README line {block.line}: the shell block ran over {BLOCK_TIMEOUT:.0f}s:\n"
                    + "".join(output)
                )
            if line is None or line.startswith(_FAILED):
                where = block.line
                if line is not None:
                    where = block.line + int(line.split()[1]) - 1
                pytest.fail(
                    f"README line {where}: the shell block starting at line {block.line} "
                    f"failed:\n{''.join(output)}"
                )
            if line.strip() == _DONE:
                return
            output.append(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


def run_python(suite: ReadmeSuite, block: readme.Block, code: str) -> None:
    script = suite.work / f"block-{block.line}.py"
    script.write_text(code)
    result = subprocess.run(
        [str(VENV_BIN / "python"), str(script)],
        env=suite.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )
    if result.returncode != 0:
        lines = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', result.stderr)
        where = block.line + int(lines[-1]) - 1 if lines else block.line
        pytest.fail(
            f"README line {where}: the Python block starting at line {block.line} failed:\n"
            f"{result.stdout}{result.stderr}"
        )


def run_blocks(suite: ReadmeSuite, blocks: list[readme.Block]) -> None:
    shell = Shell(suite.env, suite.work)
    try:
        for block in blocks:
            code = suite.adapt(block.code)
            if block.language == "sh":
                shell.run(block, code)
            elif block.language == "python":
                run_python(suite, block, code)
            else:
                pytest.fail(f"README line {block.line}: cannot run a {block.language!r} block")
    finally:
        shell.close()


def test_readme_blocks_run_in_order(readme_suite):
    blocks = readme.runnable()
    assert {b.language for b in blocks} == {"sh", "python"}, blocks
    assert any("quarry.spark" in b.code for b in blocks)  # the Spark example runs too
    started = time.monotonic()
    run_blocks(readme_suite, blocks)
    elapsed = time.monotonic() - started
    print(f"ran {len(blocks)} README blocks in {elapsed:.1f}s")
    # What the blocks did is there: the CLI tour's download, byte for byte.
    copy = readme_suite.lake / "people-copy.csv"
    assert copy.read_text() == "id,name\n1,ada\n2,grace\n"
    assert any((readme_suite.lake / "spark-demo" / "data" / "spark").rglob("*.parquet"))


def test_a_broken_block_is_reported_with_its_readme_line(readme_suite):
    """The runner itself: a failing command fails the run and names its README line."""
    text = "intro\n<!-- readme-runner: run -->\n```sh\ntrue\nfalse\ntrue\n```\n"
    (block,) = readme.blocks(text)
    with pytest.raises(pytest.fail.Exception, match=r"README line 5: the shell block"):
        run_blocks(readme_suite, [block])
    text = "<!-- readme-runner: run -->\n```python\nx = 1\nraise RuntimeError('broken')\n```\n"
    (block,) = readme.blocks(text)
    with pytest.raises(pytest.fail.Exception, match=r"README line 4: the Python block"):
        run_blocks(readme_suite, [block])
