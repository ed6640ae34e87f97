"""Graveler: the versioning core's facade (docs/architecture.md §4).

A small facade over the flows, in the manner of lakeFS's Graveler: each flow lives in its
own module and reads top to bottom there.

* quarry.graveler.reads: stat, list, the read layers and their validation, uncommitted
  changes, history and diffs;
* quarry.graveler.writes: put, delete, discard (the writer flow);
* quarry.graveler.commits: commit and staging compaction (they share seal and retire);
* quarry.graveler.merges: merge, revert, cherry-pick, merge hints;
* quarry.graveler.imports: zero-copy import (listing → ranges → one commit);
* quarry.graveler.repositories: repositories, branches, tags, settings.

The branch record is the only compare-and-swap point, and every change of it goes through
RefManager.update_branch (quarry.graveler.refs); keys and record codecs are in
quarry.graveler.layout.
"""

from __future__ import annotations

import functools
from typing import Unpack

from quarry.graveler import dumps
from quarry.graveler.commits import CommitOutcome, CommitParams, Commits, Retirement
from quarry.graveler.core import (
    DEFAULT_MAX_RESPONSE_BYTES,
    CommitRecord,
    CommittedReader,
    Core,
    RangeWriterClient,
    make_commit,
)
from quarry.graveler.imports import Imports
from quarry.graveler.layout import MERGE_HINTS_PREFIX
from quarry.graveler.merges import (
    MAX_CONFLICTS_REPORTED,
    MergeOptions,
    MergeOutcome,
    MergeParams,
    Merges,
    merge_params,
)
from quarry.graveler.reads import Layers, Reads
from quarry.graveler.repositories import CREATION_TTL_SECONDS, Repositories
from quarry.graveler.retry import DEFAULT_RETRIES, MAX_ATTEMPTS, MAX_MERGE_ATTEMPTS, Retries
from quarry.graveler.writes import StagedCount, Writes
from quarry.kv import store as kv
from quarry.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE


class Graveler(Core):
    """The core's entry point: the servicers and tests call these methods; each is one of
    the flows' (see the module docstring). The flows are public attributes too (`reads`,
    `writes`, `commits`, `merges`, `repositories`) for their finer seams (e.g.
    `commits.seal`)."""

    def __init__(  # noqa: PLR0913 — the public constructor: the parts, then tunables
        self,
        store: kv.Store,
        committed: CommittedReader,
        range_writer: RangeWriterClient,
        dirty_read_optimization: bool = True,
        branch_cache_seconds: float = 1.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retries: Retries = DEFAULT_RETRIES,
    ) -> None:
        super().__init__(
            store,
            committed,
            range_writer,
            dirty_read_optimization,
            branch_cache_seconds,
            max_response_bytes,
            retries,
        )
        self.reads = Reads(self)
        self.writes = Writes(self, self.reads)
        self.commits = Commits(self, self.reads)
        self.merges = Merges(self, self.reads)
        self.repositories = Repositories(self, self.reads)
        self.imports = Imports(self, self.reads)
        # repositories
        self.create_repository = self.repositories.create_repository
        self.installation_id = self.repositories.installation_id
        self.get_repository = self.repositories.get_repository
        self.list_repositories = self.repositories.list_repositories
        self.delete_repository = self.repositories.delete_repository
        self.update_repository = self.repositories.update_repository
        self.dump_repository = functools.partial(dumps.dump_repository, self.repositories)
        self.restore_repository = functools.partial(dumps.restore_repository, self.repositories)
        # branches, tags, settings
        self.create_branch = self.repositories.create_branch
        self.get_branch = self.repositories.get_branch
        self.list_branches = self.repositories.list_branches
        self.delete_branch = self.repositories.delete_branch
        self.reset_branch = self.repositories.reset_branch
        self.create_tag = self.repositories.create_tag
        self.get_tag = self.repositories.get_tag
        self.list_tags = self.repositories.list_tags
        self.delete_tag = self.repositories.delete_tag
        self.set_gc_rules = self.repositories.set_gc_rules
        self.get_gc_rules = self.repositories.get_gc_rules
        self.delete_gc_rules = self.repositories.delete_gc_rules
        self.set_branch_protection_rules = self.repositories.set_branch_protection_rules
        self.get_branch_protection_rules = self.repositories.get_branch_protection_rules
        # reads
        self.stat_object = self.reads.stat_object
        self.list_objects = self.reads.list_objects
        self.diff_uncommitted = self.reads.diff_uncommitted
        self.get_commit = self.reads.get_commit
        self.log = self.reads.log
        self.diff = self.reads.diff
        self.find_merge_base = self.reads.find_merge_base
        # writes
        self.put_objects = self.writes.put_objects
        self.copy_object = self.writes.copy_object
        self.delete_objects = self.writes.delete_objects
        self.discard_changes = self.writes.discard_changes
        # commits and compaction
        self.commit = self.commits.commit
        self.compact = self.commits.compact
        # imports
        self.start_import = self.imports.start_import
        self.get_import = self.imports.get_import
        self.cancel_import = self.imports.cancel_import
        # merges
        self.revert = self.merges.revert
        self.cherry_pick = self.merges.cherry_pick

    def merge(
        self,
        repo_name: str,
        source_ref: str,
        destination_branch: str,
        params: MergeParams | None = None,
        **options: Unpack[MergeOptions],
    ) -> MergeOutcome:
        """Three-way merge of `source_ref` into a branch (quarry.graveler.merges). Options
        are MergeParams' fields, given as a MergeParams and/or as keywords."""
        return self.merges.merge(
            repo_name, source_ref, destination_branch, merge_params(params, options)
        )


__all__ = [
    "CREATION_TTL_SECONDS",
    "DEFAULT_PAGE_SIZE",
    "MAX_ATTEMPTS",
    "MAX_CONFLICTS_REPORTED",
    "MAX_MERGE_ATTEMPTS",
    "MAX_PAGE_SIZE",
    "MERGE_HINTS_PREFIX",
    "CommitOutcome",
    "CommitParams",
    "CommitRecord",
    "Graveler",
    "Layers",
    "MergeOutcome",
    "MergeParams",
    "Retirement",
    "StagedCount",
    "make_commit",
]
