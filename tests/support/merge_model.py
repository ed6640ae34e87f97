"""The three-way merge as a naive model on dicts (path -> Entry), path by path: what the
real merges are checked against, and what the dict-backed fake committed store runs."""

from __future__ import annotations

from quarry.graveler.model import Conflict, DiffSummary, Entry, MergeStrategy


def same(a: Entry | None, b: Entry | None) -> bool:
    """Same content (by identity); None = absent."""
    if a is None or b is None:
        return a is b
    return a.identity == b.identity


def naive_merge(
    base: dict, source: dict, dest: dict, strategy: MergeStrategy, max_conflicts: int = 100
):
    """(merged, summary of the changes to dest, conflicts[:max_conflicts], more)."""
    merged = dict(dest)
    conflicts: list[Conflict] = []
    for path in sorted(set(base) | set(source) | set(dest)):
        b, s, d = base.get(path), source.get(path), dest.get(path)
        if same(s, b) or same(s, d):
            continue  # the destination's value stands
        if not same(d, b):
            if strategy == MergeStrategy.DEFAULT:
                conflicts.append(Conflict(path, b, s, d))
                continue
            if strategy == MergeStrategy.DEST_WINS:
                continue
        if s is None:
            merged.pop(path, None)
        else:
            merged[path] = s
    summary = DiffSummary()
    for path in set(dest) | set(merged):
        d, m = dest.get(path), merged.get(path)
        if d is None:
            summary.added += 1
        elif m is None:
            summary.removed += 1
        elif not same(d, m):
            summary.changed += 1
    return merged, summary, conflicts[:max_conflicts], max(0, len(conflicts) - max_conflicts)
