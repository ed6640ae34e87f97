"""One installed top-level package, quarry; the services live in the top-level services/
folder and are installed as quarry.services.<name> (no path hacks)."""

from __future__ import annotations

import importlib
import site
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders(base: Path, prefix: str) -> set[str]:
    return {
        ".".join([prefix, *init.parent.relative_to(base).parts]).rstrip(".")
        for init in base.rglob("__init__.py")
    }


def test_every_package_folder_is_installed():
    declared = set(_declared()["packages"])
    found = _package_folders(ROOT / "libs" / "quarry", "quarry") | _package_folders(
        ROOT / "services", "quarry.services"
    )
    assert found == declared
    assert {name.split(".")[0] for name in declared} == {"quarry"}


def test_services_import_as_quarry_services_only():
    for name in ("branch_manager", "committer", "compactor_sensor", "kv_gateway", "range_writer"):
        module = importlib.import_module(f"quarry.services.{name}.service")
        assert Path(module.__file__).is_relative_to(ROOT / "services" / name)
        assert importlib.util.find_spec(name) is None  # not a top-level package


def test_no_path_file_adds_source_roots():
    for folder in site.getsitepackages():
        assert not (Path(folder) / "quarry-source-roots.pth").exists()
