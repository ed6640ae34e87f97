"""The commit log's branch graph, laid out on the server and drawn as one SVG: a lane per
line of history, a dot per commit, a line from each commit to each parent (a merge commit's
second parent gets its own line, so merges are drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

ROW = 34  # px: the log table's row height (the template's CSS uses the same)
LANE = 16  # px between lanes
COLORS = ("#2f6fde", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285")


@dataclass(frozen=True)
class Row:
    commit_id: str
    lane: int
    lanes_after: tuple[str | None, ...]  # what each lane expects next, below this row
    from_node: frozenset[int]  # lanes below that start at this commit (its parents)
    # Lanes already running below that this commit's other parents join (a merge of a commit
    # another line expects too): an extra line from the dot, the lane's own line kept.
    joins: frozenset[int] = frozenset()


def layout(commits: Sequence[tuple[str, Sequence[str]]]) -> list[Row]:
    """(commit id, parent ids) newest first -> one Row per commit."""
    lanes: list[str | None] = []
    rows = []
    for commit_id, parents in commits:
        if commit_id in lanes:
            lane = lanes.index(commit_id)
        elif None in lanes:
            lane = lanes.index(None)
        else:
            lanes.append(None)
            lane = len(lanes) - 1
        for i, expected in enumerate(lanes):  # other lines converging on this commit end here
            if expected == commit_id and i != lane:
                lanes[i] = None
        lanes[lane] = parents[0] if parents else None
        from_node = {lane} if parents else set()
        joins = set()
        for parent in parents[1:]:
            if parent in lanes:
                joins.add(lanes.index(parent))
                continue
            slot = next((i for i, x in enumerate(lanes) if x is None and i != lane), None)
            if slot is None:
                lanes.append(None)
                slot = len(lanes) - 1
            lanes[slot] = parent
            from_node.add(slot)
        while lanes and lanes[-1] is None:
            lanes.pop()
        rows.append(Row(commit_id, lane, tuple(lanes), frozenset(from_node), frozenset(joins)))
    return rows


def _x(lane: int) -> float:
    return LANE / 2 + lane * LANE


def svg(rows: Sequence[Row]) -> str:
    """The graph for `rows`, ROW px per row, lines running off the bottom where history
    continues on the next page."""
    if not rows:
        return ""
    width = max([r.lane + 1 for r in rows] + [len(r.lanes_after) for r in rows]) * LANE
    height = len(rows) * ROW
    parts = [
        f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="branch graph">'
    ]
    for y, row in enumerate(rows):
        top = y * ROW + ROW / 2
        below = rows[y + 1] if y + 1 < len(rows) else None
        bottom = top + ROW
        for lane, expected in enumerate(row.lanes_after):
            if expected is None:
                continue
            x1 = _x(row.lane) if lane in row.from_node else _x(lane)
            x2 = _x(below.lane) if below is not None and expected == below.commit_id else _x(lane)
            color = COLORS[lane % len(COLORS)]
            parts.append(
                f'<line x1="{x1}" y1="{top}" x2="{x2}" y2="{bottom}" stroke="{color}" '
                'stroke-width="2"/>'
            )
            if lane in row.joins:
                parts.append(
                    f'<line x1="{_x(row.lane)}" y1="{top}" x2="{x2}" y2="{bottom}" '
                    f'stroke="{COLORS[row.lane % len(COLORS)]}" stroke-width="2"/>'
                )
    for y, row in enumerate(rows):
        color = COLORS[row.lane % len(COLORS)]
        parts.append(
            f'<circle cx="{_x(row.lane)}" cy="{y * ROW + ROW / 2}" r="5" fill="{color}">'
            f"<title>{escape(row.commit_id)}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)
