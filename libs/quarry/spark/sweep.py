"""Sweeping ephemeral branches that Spark writes left behind (the driver died before it
could delete them). Only the branch goes: its staged entries are dropped with it, and its
data files become unreferenced, which `quarry gc` then removes. The files are never deleted
here: a driver may have died after its merge landed, and then the target refers to them."""

from __future__ import annotations

import contextlib
import datetime as _dt
from typing import TYPE_CHECKING

from quarry import errors
from quarry.spark.common import ephemeral_created_at

if TYPE_CHECKING:
    from quarry.client import Client

DEFAULT_EPHEMERAL_TTL = _dt.timedelta(hours=24)


def stale_ephemeral_branches(
    client: Client,
    repository: str,
    older_than: _dt.timedelta = DEFAULT_EPHEMERAL_TTL,
    now: _dt.datetime | None = None,
) -> list[str]:
    now = now or _dt.datetime.now(_dt.UTC)
    stale = []
    for branch in client.iter_branches(repository):
        created = ephemeral_created_at(branch.name)
        if created is not None and now - created >= older_than:
            stale.append(branch.name)
    return stale


def sweep_ephemeral_branches(
    client: Client,
    repository: str,
    older_than: _dt.timedelta = DEFAULT_EPHEMERAL_TTL,
    now: _dt.datetime | None = None,
    dry_run: bool = False,
) -> list[str]:
    """Delete the ephemeral branches of `repository` created at least `older_than` ago
    (a job running longer than that would fail at its merge, target untouched). Returns
    their names (what would be deleted, with dry_run)."""
    stale = stale_ephemeral_branches(client, repository, older_than, now)
    if not dry_run:
        for name in stale:
            with contextlib.suppress(errors.NotFound):  # deleted meanwhile: gone either way
                client.delete_branch(repository, name)
    return stale
