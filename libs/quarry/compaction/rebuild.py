"""Rebuilding the sensor's counters from the KV store after a restart: discovery of the
branches with staged data, and counting the staged items of their tokens."""

from __future__ import annotations

import logging

from quarry.compaction.state import (
    LIST_PAGE,
    BranchState,
    SensorParts,
    Snapshot,
)
from quarry.graveler import layout, records
from quarry.graveler.layout import staging_partitions
from quarry.graveler.refs import is_dirty
from quarry.graveler.staging import SCAN_BATCH

log = logging.getLogger("quarry.compaction.sensor")


class RebuildMixin(SensorParts):
    # ---- rebuild from the KV store -------------------------------------------------------------

    def _rebuild(self, key: tuple[str, str], snapshot: Snapshot) -> int:
        """Count the staged items of a branch not rebuilt yet. Returns items scanned."""
        with self._lock:
            state = self._branches.get(key)
        if state is None or state.rebuilt:
            return 0
        with state.rebuild_lock:
            if state.rebuilt:
                return 0
            branch = snapshot.branch
            tokens = ([branch.staging_token] if is_dirty(branch) else []) + list(
                branch.sealed_tokens
            )
            with self._lock:
                before = {t: tuple(c) for t, c in state.tokens.items()}
            scanned: dict[str, list[int]] = {}
            total = [0, 0]
            items = 0
            for token in tokens:
                if (
                    self.thresholds.staged_decided(*total)
                    or items >= self.rebuild_max_items_per_branch
                ):
                    break
                counts = scanned[token] = [0, 0]
                items += self._count_token(
                    token, counts, total, self.rebuild_max_items_per_branch - items
                )
            with self._lock:
                if self._branches.get(key) is not state:
                    return items  # forgotten meanwhile
                for token, (puts, deletes) in scanned.items():
                    now = state.tokens.get(token, [0, 0])
                    was = before.get(token, (0, 0))
                    # Reports received during the scan are added to what the scan counted.
                    state.tokens[token] = [puts + now[0] - was[0], deletes + now[1] - was[1]]
                    if state.tokens[token] == [0, 0]:
                        del state.tokens[token]
                state.rebuilt = True
            if items:
                log.info(
                    "compactor-sensor: rebuilt %s/%s from the KV store: %d staged items "
                    "in %d token(s)",
                    key[0],
                    key[1],
                    items,
                    len(scanned),
                )
            return items

    def _count_token(self, token: str, counts: list[int], total: list[int], limit: int) -> int:
        items = 0
        for partition in staging_partitions(token):  # every shard of a sharded token
            iterator = self.kv.scan(partition, batch_size=SCAN_BATCH)
            try:
                for item in iterator:
                    try:
                        value = layout.decode_staged_value(partition, item.key, item.value)
                    except records.CorruptRecord as exc:
                        records.note_skipped(exc)  # uncounted; the rest of the token still is
                        continue
                    index = 0 if layout.is_staged_entry(value) else 1
                    counts[index] += 1
                    total[index] += 1
                    items += 1
                    if items >= limit or (
                        items % SCAN_BATCH == 0 and self.thresholds.staged_decided(*total)
                    ):
                        return items
            finally:
                iterator.close()
        return items

    def _maybe_discover(self) -> None:
        """Find the branches with staged or sealed data that this process has not heard of
        (after a restart): they are refreshed and rebuilt like reported ones."""
        now = self._monotonic()
        if (
            self._discovered_at is not None
            and now - self._discovered_at < self.discovery_interval_seconds
        ):
            return
        self._discovered_at = now
        with records.listing():  # corrupt repository/branch records: skipped, counted
            found = self._discover()
        if found:
            log.info("compactor-sensor: found %d branch(es) with staged data to count", found)

    def _discover(self) -> int:
        found = 0
        after = ""
        while True:
            repos = self.refs.list_repositories(after, LIST_PAGE)
            for repo in repos:
                branch_after = ""
                while True:
                    branches = self.refs.list_branches(repo, branch_after, LIST_PAGE)
                    for branch in branches:
                        if not is_dirty(branch) and not branch.sealed_tokens:
                            continue
                        with self._lock:
                            if (repo.name, branch.name) not in self._branches:
                                self._branches[(repo.name, branch.name)] = BranchState()
                                found += 1
                    if len(branches) < LIST_PAGE:
                        break
                    branch_after = branches[-1].name
            if len(repos) < LIST_PAGE:
                break
            after = repos[-1].name
        return found
