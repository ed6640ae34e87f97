"""The storage format version, stamped once in the KV store (docs/architecture.md §7).

quarry.FORMAT_VERSION is the one number for the whole storage format: the KV stamp, the KV
records and the range/metarange files (their format tags and id headers derive from it,
quarry.committed.format). Data of another version is refused with FormatVersionMismatch
(FAILED_PRECONDITION / FORMAT_VERSION_MISMATCH) naming the rebuild path, REBUILD_HINT.
"""

from __future__ import annotations

from quarry import FORMAT_VERSION, errors
from quarry.graveler.layout import FORMAT_VERSION_KEY, INSTALLATION_ID_KEY, QUARRY_PARTITION
from quarry.kv import store as kv

# The keys are the storage layout's (quarry.graveler.layout).
PARTITION = QUARRY_PARTITION
KEY = FORMAT_VERSION_KEY


# The rebuild path, named by every refusal of data written in another storage format.
NEWER_HINT = (
    "It was written by a newer build of Quarry: run that build (a store is never taken back "
    "to an older format)."
)
REBUILD_HINT = (
    "Rebuild the data: stop the services, run `quarry store export FILE --kv-url <this store>` "
    "(export reads a store of any format version) and `quarry store import FILE --kv-url <an "
    "empty store>` with this build; import also rewrites the committed data (ranges and "
    "metaranges) of every repository in this build's format."
)


class FormatVersionMismatch(errors.FailedPrecondition):
    """Data written in another storage format version: the KV store's stamp, or a range or
    metarange file. Never read as if it were this version's."""

    reason = "FORMAT_VERSION_MISMATCH"


def ensure_format_version(store: kv.Store, expected: int = FORMAT_VERSION) -> int:
    """Stamp `expected` if the store has no version yet; refuse any other version.

    Racing first starts are safe: the stamp is a set-if-absent, and the loser re-reads.
    """
    for _ in range(2):
        try:
            found = store.get(PARTITION, KEY).value
        except kv.KeyNotFound:
            try:
                store.set_if(PARTITION, KEY, str(expected).encode(), kv.ABSENT)
                return expected
            except kv.PredicateFailed:
                continue  # another process stamped it first: read what it wrote
        try:
            version = int(found.decode())
        except ValueError:
            version = -1
        if version != expected:
            # A newer store is never rebuilt by this build (it would be downgraded, losing
            # what the newer format holds): run the build that wrote it.
            hint = REBUILD_HINT if version < expected else NEWER_HINT
            raise FormatVersionMismatch(
                f"the KV store holds storage format version {found.decode(errors='replace')!r} "
                f"but this build of Quarry reads and writes version {expected}. {hint}",
                metadata={"found": found.decode(errors="replace"), "expected": str(expected)},
            )
        return version
    raise errors.Unavailable("could not read the storage format version")


INSTALLATION_KEY = INSTALLATION_ID_KEY


def ensure_installation_id(store: kv.Store) -> str:
    """This installation's id (one KV store = one installation), stamped once: it tells
    ownership markers written by this installation from those of another one sharing the
    object store. Set-if-absent like the format version; the loser of a race re-reads."""
    import uuid

    for _ in range(2):
        try:
            found = store.get(PARTITION, INSTALLATION_KEY).value
        except kv.KeyNotFound:
            stamp = uuid.uuid4().hex
            try:
                store.set_if(PARTITION, INSTALLATION_KEY, stamp.encode(), kv.ABSENT)
                return stamp
            except kv.PredicateFailed:
                continue  # another process stamped it first: read what it wrote
        return found.decode(errors="replace")
    raise errors.Unavailable("could not read the installation id")
