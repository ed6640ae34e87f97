"""Quarry: version control for data-lake metadata."""

__version__ = "0.1.0"

# The storage format this build reads and writes: the ONE version number of everything
# Quarry stores. Stamped in the KV store at first start (partition `quarry`, key
# `format-version`; a mismatch refuses to start), and the format tag and id header of every
# range and metarange file (quarry.committed.format; another version is refused on read).
# Bump it once for any change to what is stored; `quarry export` + `quarry import` rebuild
# (import converts records in exporting._Rebuilder, committed files in
# quarry.committed.legacy: add the old number to its LEGACY_VERSIONS).
#   1: entry identity without the physical address.
#   2: entry identity covers the physical address (docs/architecture.md §2); ranges,
#      metaranges and their ids rewritten by import.
FORMAT_VERSION = 2
