"""committer: commits, history and diffs (merge, revert, cherry-pick and compaction land
with their issues)."""
