"""RefManager.update_branch: the one way a branch record changes (read, apply a function to a
copy, compare-and-swap, retry). It must never overwrite a change it did not see."""

import pytest

from quarry.graveler import errors as gerrors
from quarry.graveler.retry import ONCE, RetryPolicy


@pytest.fixture
def refs_and_repo(graveler, repo):
    return graveler.refs, graveler.refs.get_repository(repo)


def _race_once(refs, repo, monkeypatch, change):
    """Apply `change` to the stored record right before the next swap (once)."""
    real_set = refs.set_branch_if
    state = {"left": 1}

    def racing_set(repo_, branch, predicate):
        if state["left"]:
            state["left"] -= 1
            current, current_predicate = refs.get_branch(repo_, branch.name)
            change(current)
            from quarry.kv.store import Equals

            real_set(repo_, current, Equals(current_predicate))
        return real_set(repo_, branch, predicate)

    monkeypatch.setattr(refs, "set_branch_if", racing_set)


def test_a_lost_swap_reapplies_the_function_to_the_new_record(refs_and_repo, monkeypatch):
    """The concurrent change (a compacted metarange) survives: never overwritten blindly."""
    refs, repo = refs_and_repo
    _race_once(
        refs, repo, monkeypatch, lambda b: setattr(b, "compacted_metarange_id", "concurrent")
    )
    seen = []

    def mark(branch):
        seen.append(branch.compacted_metarange_id)
        branch.dirty = True
        return branch

    update = refs.update_branch(repo, "main", mark, step="test")
    stored, _ = refs.get_branch(repo, "main")
    assert seen == ["", "concurrent"]  # applied again to the record that won
    assert stored.compacted_metarange_id == "concurrent" and stored.dirty
    assert update.changed and update.before.compacted_metarange_id == "concurrent"


def test_no_change_and_abort_write_nothing(refs_and_repo, kv_store):
    refs, repo = refs_and_repo
    before = refs.get_branch(repo, "main")
    kv_store.reset()
    update = refs.update_branch(repo, "main", lambda branch: None)
    assert not update.changed and update.predicate == before[1]

    def refuse(branch):
        raise gerrors.DirtyBranch("no")

    with pytest.raises(gerrors.DirtyBranch):
        refs.update_branch(repo, "main", refuse)
    assert kv_store.total(op="set_if") == 0
    assert refs.get_branch(repo, "main") == before


def _always_moved(refs, monkeypatch) -> list[str]:
    """Every swap loses: the stored record changes right before it. Returns the swaps
    tried (their branch names), as they happen."""
    from quarry.kv.store import Equals

    real_set = refs.set_branch_if
    calls: list[str] = []

    def always_moved(repo_, branch, predicate):
        calls.append(branch.name)
        current, current_predicate = refs.get_branch(repo_, branch.name)
        current.compacted_metarange_id = f"moved-{len(calls)}"
        real_set(repo_, current, Equals(current_predicate))
        return real_set(repo_, branch, predicate)

    monkeypatch.setattr(refs, "set_branch_if", always_moved)
    return calls


def test_contention_past_the_budget_is_branch_contended(refs_and_repo, monkeypatch):
    refs, repo = refs_and_repo
    calls = _always_moved(refs, monkeypatch)
    with pytest.raises(gerrors.BranchContended):
        refs.update_branch(
            repo, "main", lambda b: b, policy=RetryPolicy(max_attempts=3, base_seconds=0)
        )
    assert len(calls) == 3


def test_once_against_an_earlier_read_fails_if_the_record_changed(refs_and_repo):
    refs, repo = refs_and_repo
    read = refs.get_branch(repo, "main")
    refs.update_branch(repo, "main", lambda b: setattr(b, "dirty", True) or b)
    with pytest.raises(gerrors.BranchContended):
        refs.update_branch(
            repo, "main", lambda b: setattr(b, "commit_id", "x") or b, policy=ONCE, expect=read
        )
    assert refs.get_branch(repo, "main")[0].commit_id == read[0].commit_id


def test_the_retry_limits_are_the_services_settings(tmp_path, monkeypatch):
    """A service's core (quarry.runtime.wiring) retries a contended branch as many times as
    QUARRY_BRANCH_RETRY_ATTEMPTS says, and a merge QUARRY_MERGE_RETRY_ATTEMPTS times."""
    from quarry.config import load_settings
    from quarry.kv.memory import MemoryStore
    from quarry.runtime.wiring import core_dependencies
    from support.fake_committed import FakeCommitted

    settings = load_settings(
        env={
            "QUARRY_BRANCH_RETRY_ATTEMPTS": "4",
            "QUARRY_BRANCH_RETRY_BASE_SECONDS": "0.0005",
            "QUARRY_BRANCH_RETRY_CAP_SECONDS": "0.001",
            "QUARRY_MERGE_RETRY_ATTEMPTS": "2",
        },
        home=str(tmp_path),
    )
    committed = FakeCommitted()
    deps = core_dependencies(settings, MemoryStore(), committed, committed, start_dropper=False)
    graveler = deps.graveler
    repo = graveler.create_repository("demo", str(tmp_path / "lake"))
    refs = graveler.refs
    calls = _always_moved(refs, monkeypatch)
    with pytest.raises(gerrors.BranchContended):
        refs.update_branch(repo, "main", lambda b: b)  # no policy named: the core's
    assert len(calls) == 4
    assert graveler.retries.branch.cap_seconds == 0.001
    assert graveler.retries.merge.max_attempts == 2
    for close in deps.closers:
        close()


@pytest.mark.parametrize(
    "env",
    [
        {"QUARRY_BRANCH_RETRY_ATTEMPTS": "0"},
        {"QUARRY_MERGE_RETRY_ATTEMPTS": "0"},
        {"QUARRY_BRANCH_RETRY_BASE_SECONDS": "0"},
        {"QUARRY_BRANCH_RETRY_BASE_SECONDS": "1", "QUARRY_BRANCH_RETRY_CAP_SECONDS": "0.5"},
        {"QUARRY_KV_THROTTLE_RETRIES": "-1"},
        {"QUARRY_KV_THROTTLE_BACKOFF_BASE_SECONDS": "3"},  # above the 2 s cap
    ],
)
def test_retry_limits_that_could_not_work_are_refused(env, tmp_path):
    from quarry import errors
    from quarry.config import load_settings

    with pytest.raises(errors.InvalidArgument, match=r"setting.* must be"):
        load_settings(env=env, home=str(tmp_path))
