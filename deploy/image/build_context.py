"""Prepare the `podman build` context of the Quarry images (run by `make image`).

Writes into the context directory:
  quarry-<version>-py3-none-any.whl   the project's wheel, generated protobuf code included
  constraints.txt                     every package of the tested .venv pinned (pip freeze)
  requirements.txt                    the project's dependencies (pyproject), under those pins
  requirements-spark.txt              the `spark` extra (PySpark, pandas) for the GC image
  wheels/                             wheels of all of them, fetched by the host's pip

The image build then installs from wheels/ with --no-index: the same versions the tests ran
against, no network and no registry inside the build. Files are rewritten only when their
content changes, and the wheel is built with a fixed SOURCE_DATE_EPOCH, so podman's layer
cache holds across runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Reproducible wheel timestamps (zip entries): an unchanged tree gives an identical wheel.
SOURCE_DATE_EPOCH = "1700000000"


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# The host's pip configuration may name index folders that do not exist for every package;
# pip warns once per package and missing folder. Not our concern: keep the output readable.
_NOISE = "is ignored: it is neither a file nor a directory"


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(
        [python, "-m", "pip", *args], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    sys.stderr.write("".join(line for line in proc.stderr.splitlines(True) if _NOISE not in line))
    if proc.returncode != 0:
        raise SystemExit(f"pip {args[0]} failed ({proc.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("context", type=Path)
    parser.add_argument("--spark", action="store_true", help="also the spark extra's wheels")
    args = parser.parse_args()
    python = sys.executable
    context: Path = args.context
    wheels = context / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    version = project["version"]
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pins = "".join(line + "\n" for line in frozen.splitlines() if "==" in line)
    _write_if_changed(context / "constraints.txt", pins)
    requirements = "-c constraints.txt\n" + "".join(f"{d}\n" for d in project["dependencies"])
    _write_if_changed(context / "requirements.txt", requirements)
    spark = project["optional-dependencies"]["spark"]
    _write_if_changed(
        context / "requirements-spark.txt",
        "-c constraints.txt\n" + "".join(f"{d}\n" for d in spark),
    )

    # Dependencies (pip's cache makes a second run quick; present wheels are kept).
    wanted = ["-r", str(context / "requirements.txt")]
    if args.spark:
        wanted += ["-r", str(context / "requirements-spark.txt")]
    _pip(python, "wheel", "-q", "--wheel-dir", str(wheels), *wanted)

    # The project's wheel. setuptools builds in the tree's build/ folder and copies only newer
    # files there: clear it so no stale or deleted module lands in the wheel.
    for stale in (REPO / "build").glob("*"):
        if stale.name.startswith(("lib", "bdist")):
            shutil.rmtree(stale)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
        _pip(
            python,
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            tmp,
            str(REPO),
            env=env,
        )
        built = list(Path(tmp).glob(f"quarry-{version}-*.whl"))
        if len(built) != 1:
            raise SystemExit(f"expected one quarry {version} wheel, got {built}")
        target = context / built[0].name
        for old in context.glob("quarry-*.whl"):
            if old.name != target.name:
                old.unlink()
        if not target.exists() or target.read_bytes() != built[0].read_bytes():
            shutil.copyfile(built[0], target)
    print(f"build context ready: {context} (quarry {version})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
