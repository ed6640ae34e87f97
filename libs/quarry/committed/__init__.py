"""Committed storage: immutable ranges and metaranges in the object store (ARCHITECTURE §5).

    manager = CommittedManager(lambda ns: open_blob_store(ns, settings), settings.effective_cache_dir)
    result = manager.apply_changes(namespace, base_metarange_id, sorted_changes)
    manager.get_entry(namespace, result.metarange_id, "path")
"""

from quarry.committed.errors import (DuplicatePath, InvalidMetaRangeId, InvalidPath,
                                     InvalidStream, MetaRangeNotFound, NotImplementedYet,
                                     RangeCorrupt, RangeNotFound, UnsortedInput)
from quarry.committed.format import (EMPTY_METARANGE_ID, METARANGE_SCHEMA, RANGE_SCHEMA,
                                     entry_bytes, is_boundary, metarange_key, range_key)
from quarry.committed.iterators import EntryIterator
from quarry.committed.manager import (DEFAULT_MAX_RANGE_BYTES, DEFAULT_TARGET_RANGE_ENTRIES,
                                      CommittedManager, CommittedStats)

__all__ = [
    "CommittedManager", "CommittedStats", "DEFAULT_MAX_RANGE_BYTES",
    "DEFAULT_TARGET_RANGE_ENTRIES", "DuplicatePath", "EMPTY_METARANGE_ID", "EntryIterator",
    "InvalidMetaRangeId", "InvalidPath", "InvalidStream", "METARANGE_SCHEMA", "MetaRangeNotFound",
    "NotImplementedYet", "RANGE_SCHEMA", "RangeCorrupt", "RangeNotFound", "UnsortedInput",
    "entry_bytes", "is_boundary", "metarange_key", "range_key",
]
