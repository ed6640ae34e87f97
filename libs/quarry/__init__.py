"""Quarry: version control for data-lake metadata."""

__version__ = "0.1.0"

# The storage format this build reads and writes. Stamped in the KV store at first start
# (partition `quarry`, key `format-version`); a mismatch refuses to start.
FORMAT_VERSION = 1
