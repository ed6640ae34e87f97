"""The commit log's graph layout (quarry.console.graph): lanes, merges drawn."""

from quarry.console import graph


def test_a_linear_history_stays_in_one_lane():
    rows = graph.layout([("c3", ["c2"]), ("c2", ["c1"]), ("c1", [])])
    assert [r.lane for r in rows] == [0, 0, 0]
    assert rows[-1].lanes_after == ()


def test_a_merge_opens_a_lane_for_its_second_parent_and_closes_it_where_it_joins():
    # m merges f1 (feature) into a2 (main); both descend from base.
    commits = [("m", ["a2", "f1"]), ("a2", ["base"]), ("f1", ["base"]), ("base", [])]
    rows = graph.layout(commits)
    assert rows[0].lane == 0 and rows[0].from_node == {0, 1}
    assert rows[0].lanes_after == ("a2", "f1")
    assert rows[2].lane == 1  # the feature commit in its own lane
    assert rows[3].lane == 0 and rows[3].lanes_after == ()
    drawn = graph.svg(rows)
    assert drawn.count("<circle") == 4
    # From the merge: one line straight down, one sideways to the second parent's lane.
    assert '<line x1="8.0" y1="17.0" x2="8.0" y2="51.0"' in drawn
    assert '<line x1="8.0" y1="17.0" x2="24.0" y2="51.0"' in drawn


def test_commit_ids_are_escaped_in_the_svg():
    assert "&lt;x&gt;" in graph.svg(graph.layout([("<x>", [])]))


def test_a_merge_of_a_commit_another_lane_expects_keeps_that_lane_and_adds_a_join():
    # m (feature) merges main's c1 into feature's f1; main's head c2 also descends from c1.
    commits = [("c2", ["c1"]), ("m", ["f1", "c1"]), ("f1", ["c0"]), ("c1", ["c0"]), ("c0", [])]
    rows = graph.layout(commits)
    merge = rows[1]
    assert merge.lane == 1 and merge.joins == {0} and merge.from_node == {1}
    drawn = graph.svg(rows)
    # Lane 0 runs on straight through the merge's row, and the merge joins it.
    assert '<line x1="8.0" y1="51.0" x2="8.0" y2="85.0"' in drawn
    # Two lines leave the merge's dot: down its own lane (to f1) and over into lane 0.
    assert '<line x1="24.0" y1="51.0" x2="24.0" y2="85.0"' in drawn
    assert '<line x1="24.0" y1="51.0" x2="8.0" y2="85.0"' in drawn
