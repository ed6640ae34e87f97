"""compactor-sensor: per-branch staging statistics; asks the committer to compact branches
past a threshold."""
