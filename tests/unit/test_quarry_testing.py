"""The contract suites are importable from outside tests/ (issue 24): a new backend runs
them by subclassing quarry.testing's classes. Here a project of its own - a temporary
directory with two test modules, no tests/ on the path, no conftest - runs the KV, blob and
committed contracts for the memory, local-directory and in-process backends in a child
pytest, and a deliberately broken store fails the KV contract in the same run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

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


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> subprocess.CompletedProcess:
    """One child pytest (one interpreter start-up for both tests below) in a project of its
    own: the module of the memory/local/in-process backends and the broken store's."""
    project = tmp_path_factory.mktemp("elsewhere")
    (project / "test_my_backend.py").write_text(OUTSIDE)
    (project / "test_broken_backend.py").write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        # -rA: every test's outcome in the summary, so each module's are told apart.
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def outcomes(output: str, module: str) -> Counter:
    """PASSED/FAILED/SKIPPED/ERROR... of `module`'s tests, from the child's -rA summary."""
    return Counter(
        outcome
        for outcome, name in re.findall(r"^([A-Z]+) (\w+)\.py::", output, re.MULTILINE)
        if name == module
    )


def test_a_new_backend_runs_the_contracts_by_importing_them(outside):
    mine = outcomes(outside.stdout, "test_my_backend")
    assert set(mine) <= {"PASSED", "SKIPPED"}, outside.stdout[-3000:] + outside.stderr[-3000:]
    assert mine["PASSED"] >= 100, outside.stdout[-500:]


def test_the_kv_contract_fails_a_store_that_breaks_it(outside):
    assert outside.returncode == 1, outside.stdout[-3000:] + outside.stderr[-3000:]
    assert outcomes(outside.stdout, "test_broken_backend")["FAILED"] >= 1
    assert re.search(
        r"^FAILED test_broken_backend\.py::TestBroken::test_set_if_absent",
        outside.stdout,
        re.MULTILINE,
    ), outside.stdout[-3000:]
