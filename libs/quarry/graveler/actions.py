"""The flows' seam to quarry.actions: build an event, read the action files from the ref
it is about, run the hooks. A service without actions (core.actions None) pays nothing; a
commit with actions on but no action files pays one listing of the "_" prefix of the
metarange it commits (the metarange's index says which ranges could hold a "_" path: none
read when none can), and its post-event none (a cached negative answer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from quarry.actions.files import PREFIXES, Action
from quarry.actions.runs import Event
from quarry.graveler import requests
from quarry.graveler.core import Core
from quarry.graveler.reads import Layers, Reads
from quarry.graveler.refs import Repository
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from quarry.graveler.commits import CommitParams

log = logging.getLogger(__name__)


def commit_event(repo: Repository, branch: str, params: CommitParams, event_type: str) -> Event:
    return Event(
        event_type,
        repo.name,
        branch,
        branch,
        params.message,
        params.committer,
        dict(params.metadata or {}),
    )


def _load(core: Core, reads: Reads, layers: Layers) -> list[Action]:
    """The action files of a metarange. A metarange is immutable, so "it has none" is
    remembered by its id (Actions.known_empty): a commit's post-event, and every later
    event about the same tree (a merge from the same source, a branch from that commit),
    look no further. Only the negative answer is kept: action files are read each time
    (their bytes live at addresses Quarry does not own when imported)."""
    key = (layers.repo.storage_namespace, layers.base_metarange_id)
    if core.actions.known_empty(key):
        return []
    iterator = reads.iterator(layers, PREFIXES[0], "_")
    try:
        actions = core.actions.load(iterator)
    finally:
        iterator.close()
    if not actions:
        core.actions.remember_empty(key)
    return actions


def pre_event(core: Core, reads: Reads, repo: Repository, metarange_id: str, event: Event) -> None:
    """Run a pre-event's hooks with the action files of a metarange (what a commit is about
    to commit; a merge's source). Raises HookFailed or InvalidActionFile; returns when
    every hook passed or none applies."""
    if core.actions is None:
        return
    core.actions.run(repo.partition, event, _load(core, reads, Layers(repo, [], metarange_id)))


def post_event(
    core: Core, reads: Reads, repo: Repository, commit: types_pb2.Commit, event: Event
) -> None:
    """Post-event hooks never change the outcome: every failure is recorded, none raised.
    They run once the call's outcome is recorded when it carries a request id
    (quarry.graveler.requests.after_recorded), else now."""
    if core.actions is None:
        return
    requests.after_recorded(lambda: _run_post_event(core, reads, repo, commit, event))


def _run_post_event(
    core: Core, reads: Reads, repo: Repository, commit: types_pb2.Commit, event: Event
) -> None:
    assert core.actions is not None
    try:
        actions = _load(core, reads, Layers(repo, [], commit.metarange_id))
    except Exception as invalid:
        core.actions.fail_run(repo.partition, event, str(invalid))
        return
    try:
        core.actions.run(repo.partition, event, actions)
    except Exception:
        log.exception("post-event actions failed")


def ref_event(  # noqa: PLR0913 — the event's fields
    core: Core,
    reads: Reads,
    repo: Repository,
    kind: str,
    commit_id: str,
    branch: str = "",
    source_ref: str = "",
    tag: str = "",
) -> Callable[[], None]:
    """A branch or tag event (kind: create-branch, delete-branch, create-tag, delete-tag)
    whose action files are those of `commit_id` (the new branch's source, the deleted
    branch's HEAD, the tag's commit): runs the pre-hooks now (raising HookFailed), returns
    what runs the post-hooks once the operation is done."""
    if core.actions is None:
        return lambda: None
    commit = core.refs.get_commit(repo, commit_id)
    event = Event(f"pre-{kind}", repo.name, branch, source_ref, commit_id=commit_id, tag_id=tag)
    pre_event(core, reads, repo, commit.metarange_id, event)

    def post() -> None:
        event.event_type = f"post-{kind}"
        post_event(core, reads, repo, commit, event)

    return post
