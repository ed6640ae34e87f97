"""`quarry import`'s own logic: --from/--to pairing, REPO/ID, and Ctrl-C while waiting (asks
whether to cancel; yes cancels and waits for the end, no leaves the import running)."""

from __future__ import annotations

import argparse

import pytest

from quarry.cli import importing
from quarry.cli.base import CliError, UsageError
from quarry.v1 import committer_pb2 as cm


def _args(**kw):
    return argparse.Namespace(**{"sources": None, "targets": None, "repo": None, **kw})


def test_pairs_name_one_repository_and_branch():
    repo, branch, pairs = importing._destinations(
        _args(
            sources=["s3://b/x", "/data/y"],
            targets=["quarry://r/main/raw/x", "quarry://r/main/y"],
        )
    )
    assert (repo, branch, pairs) == ("r", "main", [("s3://b/x", "raw/x"), ("/data/y", "y")])
    for sources, targets in (
        (["s3://b/x"], []),
        ([], []),
        (["s3://b/x", "/y"], ["quarry://r/main/x", "quarry://other/main/y"]),
    ):
        # A command line that cannot be run: a usage error (exit 2), as the README says.
        with pytest.raises(UsageError):
            importing._destinations(_args(sources=sources, targets=targets))
    with pytest.raises(CliError):
        importing._destinations(_args(sources=["s3://b/x"], targets=["s3://not-quarry/x"]))


def test_ids_are_repo_slash_id_or_repo_option():
    assert importing._id(_args(id="r/abc")) == ("r", "abc")
    assert importing._id(_args(id="abc", repo="r")) == ("r", "abc")
    with pytest.raises(CliError):
        importing._id(_args(id="abc"))


class FakeClient:
    def __init__(self, interrupts: int):
        self.interrupts = interrupts
        self.cancelled = 0
        self.polls = 0

    def get_import_status(self, repository, import_id):
        self.polls += 1
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        state = cm.IMPORT_STATE_CANCELLED if self.cancelled else cm.IMPORT_STATE_RUNNING
        if self.polls > 3 and not self.cancelled:
            state = cm.IMPORT_STATE_COMPLETED
        return cm.Import(id=import_id, repository=repository, state=state)

    def cancel_import(self, repository, import_id):
        self.cancelled += 1
        return cm.Import(
            id=import_id,
            repository=repository,
            state=cm.IMPORT_STATE_RUNNING,
            cancel_requested=True,
        )


class FakeContext:
    def __init__(self, client):
        self.client = client


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(importing, "POLL_SECONDS", 0)


def test_ctrl_c_answered_yes_cancels_and_waits_for_the_end(monkeypatch):
    monkeypatch.setattr(importing, "_ask_to_cancel", lambda: True)
    client = FakeClient(interrupts=1)
    running = cm.Import(id="i", repository="r", state=cm.IMPORT_STATE_RUNNING)
    final = importing._wait(FakeContext(client), running, show_progress=False)
    assert client.cancelled == 1 and final.state == cm.IMPORT_STATE_CANCELLED


def test_ctrl_c_answered_no_leaves_the_import_running(monkeypatch, capsys):
    monkeypatch.setattr(importing, "_ask_to_cancel", lambda: False)
    client = FakeClient(interrupts=1)
    running = cm.Import(id="i", repository="r", state=cm.IMPORT_STATE_RUNNING)
    with pytest.raises(KeyboardInterrupt):
        importing._wait(FakeContext(client), running, show_progress=False)
    assert client.cancelled == 0
    assert "quarry import status r/i" in capsys.readouterr().err
