"""Checks a fault-injection history (support/chaos.History) against the guarantees of
docs/architecture.md §4 (the consistency guarantees of the KV design) and issue 10:

* If a write succeeds, successive reads and listings return that write or another that did
  not happen before it (read-your-writes for its writer; a floor for everyone after it).
* A successful read / listing returns the contents of some write that did not happen after
  it (the value was invoked before the read completed).
* A successful commit holds the contents of some listing (every path: a value at least as
  new as the last write acknowledged before the commit began, invoked before it ended).
* Mutating operations may fail; a failed one's contents may still be visible (any failure
  counts as "maybe applied").
* Every acknowledged write is committed or still staged at the end; every acknowledged
  commit and merge is in its branch's log.

Each path is written by one writer, sequentially, so its attempts are totally ordered and
an observed value (a physical address, unique per version) maps back to an attempt.

A violation is blamed on issue 10 item 1 (identity ignores the address) when the older
value seen and a value the observation was allowed to see (the last acknowledged one, or a
write sent while it ran) are both "re-pointed" entries (same size, no checksum): exactly
the case today's identity rule cannot tell apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from support.chaos import Op

REPOINT_SIZE = 100  # every re-pointed entry has this size and no checksum


@dataclass
class Attempt:
    index: int
    address: str
    checksum: str
    size: int
    op: Op

    @property
    def repointed(self) -> bool:
        return self.checksum == "" and self.size == REPOINT_SIZE


@dataclass
class Violation:
    category: str  # lost | stale-read | stale-listing | commit-content | log | merge
    message: str
    item1: bool = False  # explained by issue 10 item 1

    def __str__(self) -> str:
        return f"[{self.category}{' item 1' if self.item1 else ''}] {self.message}"


@dataclass
class Timeline:
    """The write attempts of one (branch, path), in invocation order."""

    attempts: list[Attempt] = field(default_factory=list)

    def add(self, address: str, checksum: str, size: int, op: Op) -> None:
        self.attempts.append(Attempt(len(self.attempts), address, checksum, size, op))

    def floor(self, before: float) -> Attempt | None:
        """The last attempt acknowledged before `before`."""
        best = None
        for a in self.attempts:
            if a.op.ok and a.op.t_complete < before:
                best = a
        return best

    def source(self, address: str, before: float) -> Attempt | None:
        """The latest attempt that wrote `address` and was invoked before `before`."""
        best = None
        for a in self.attempts:
            if a.address == address and a.op.t_invoke < before:
                best = a
        return best

    def may_apply_late(self, address: str) -> bool:
        """Some attempt of `address` timed out: the server may still have been applying it
        after the client gave up, so it is concurrent with everything after it."""
        return any(
            a.address == address and a.op.outcome in ("DEADLINE_EXCEEDED", "CANCELLED")
            for a in self.attempts
        )


def check_observation(
    timeline: Timeline,
    seen: str | None,
    t_invoke: float,
    t_complete: float,
    what: str,
    category: str,
) -> Violation | None:
    """A value `seen` (None = absent) by an observation running in [t_invoke, t_complete]."""
    floor = timeline.floor(t_invoke)
    if seen is None:
        if floor is None:
            return None
        return Violation(
            category, f"{what}: absent, but {floor.address} was acknowledged before", item1=False
        )
    source = timeline.source(seen, t_complete)
    if source is None:
        return Violation(category, f"{what}: saw {seen}, which no write had sent yet")
    if floor is None or source.index >= floor.index:
        return None
    if timeline.may_apply_late(seen):
        return None
    return Violation(
        category,
        f"{what}: saw {seen} (attempt {source.index}) after "
        f"{floor.address} (attempt {floor.index}) was acknowledged",
        item1=_item1_explains(timeline, source, floor.index, t_complete),
    )


def check_final(timeline: Timeline, seen: str | None, what: str) -> Violation | None:
    """At the end: the last acknowledged value, or a later one whose write failed."""
    acked = [a for a in timeline.attempts if a.op.ok]
    if not acked:
        return None
    last = acked[-1]
    allowed = {last.address} | {a.address for a in timeline.attempts[last.index + 1 :]}
    if seen in allowed:
        return None
    if seen is not None and timeline.may_apply_late(seen):
        return None
    source = timeline.source(seen, float("inf")) if seen else None
    return Violation(
        "lost",
        f"{what}: holds {seen} but {last.address} (attempt {last.index}, "
        f"{last.op.kind}) was acknowledged and nothing after it was",
        item1=_item1_explains(timeline, source, last.index, float("inf")),
    )


def _item1_explains(
    timeline: Timeline, source: Attempt | None, first_allowed: int, before: float
) -> bool:
    """The older value seen and one the observation was allowed to see (the floor or a
    write sent during the observation) are both re-pointed: same size, no checksum, so
    today's identity (without the address) cannot tell them apart and a commit keeps the
    older one (issue 10 item 1)."""
    if source is None or not source.repointed:
        return False
    return any(a.repointed for a in timeline.attempts[first_allowed:] if a.op.t_invoke < before)
