"""The contract suites are importable from outside tests/ (issue 24): a new backend runs
them by subclassing quarry.testing's classes. Here a project of its own - a temporary
directory with one test module, no tests/ on the path, no conftest - runs the KV, blob and
committed contracts for the memory, local-directory and in-process backends in a child
pytest, and a deliberately broken store fails the KV contract there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

OUTSIDE = textwrap.dedent(
    """
    import pytest

    from quarry.blob import LocalBlobStore
    from quarry.committed import CommittedManager
    from quarry.kv.memory import MemoryStore
    from quarry.testing.blob import BlobContract, StoreKind, local_leftovers
    from quarry.testing.committed import CommittedContract, Implementation
    from quarry.testing.kv import KVContract


    class TestMemoryKV(KVContract):
        @pytest.fixture
        def kv_store(self):
            store = MemoryStore()
            yield store
            store.close()


    class TestLocalBlob(BlobContract):
        @pytest.fixture
        def kind(self, tmp_path):
            return StoreKind(
                "local", lambda ns: LocalBlobStore(tmp_path / ns), leftovers=local_leftovers(tmp_path)
            )


    class TestManager(CommittedContract):
        SUPPORTS = {"manager": frozenset({"ranges", "range_reuse", "pages"})}

        @pytest.fixture
        def committed(self, request, tmp_path):
            manager = CommittedManager(
                lambda ns: LocalBlobStore(ns, durable=False), None, target_range_entries=8
            )
            yield Implementation(
                "manager", manager, manager, str(tmp_path / "ns"), page=manager.metarange_page
            )
            manager.close()
    """
)

BROKEN = textwrap.dedent(
    """
    import pytest

    from quarry.kv.memory import MemoryStore
    from quarry.testing.kv import KVContract


    class LosesConditions(MemoryStore):
        # A store whose conditional write ignores its condition: the contract must catch it.
        def set_if(self, partition, key, value, predicate=None):
            self.set(partition, key, value)


    class TestBroken(KVContract):
        @pytest.fixture
        def kv_store(self):
            return LosesConditions()
    """
)


def run_outside(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    project = tmp_path / "elsewhere"
    project.mkdir()
    (project / "test_my_backend.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def passed(output: str) -> int:
    found = re.search(r"(\d+) passed", output)
    return int(found.group(1)) if found else 0


def test_a_new_backend_runs_the_contracts_by_importing_them(tmp_path):
    result = run_outside(tmp_path, OUTSIDE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert passed(result.stdout) >= 100, result.stdout[-500:]


def test_the_kv_contract_fails_a_store_that_breaks_it(tmp_path):
    result = run_outside(tmp_path, BROKEN)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "failed" in result.stdout and "test_set_if_absent" in result.stdout
