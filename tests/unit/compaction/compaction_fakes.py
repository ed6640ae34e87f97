"""Fakes for the compaction unit tests."""

from quarry.compaction.sensor import CompactionResult
from quarry.graveler.staging import new_token
from quarry.kv import store as kv
from quarry.v1 import types_pb2


class FakeCompactor:
    """Counts Compact calls. `behaviour`: "noop" (answers, changes nothing), "compact"
    (does what Compact does to the branch record: tokens gone, compacted metarange set) or
    an exception to raise."""

    def __init__(self, store, behaviour="compact"):
        self.store = store
        self.behaviour = behaviour
        self.calls: list[tuple[str, str]] = []

    def compact(self, repository, branch):
        self.calls.append((repository, branch))
        if isinstance(self.behaviour, BaseException):
            raise self.behaviour
        if self.behaviour == "noop":
            return CompactionResult("", 0)
        from quarry.graveler.refs import RefManager

        refs = RefManager(self.store)
        repo = refs.get_repository(repository)
        record, predicate = refs.get_branch(repo, branch)
        compacted = types_pb2.Branch()
        compacted.CopyFrom(record)
        tokens = [record.staging_token, *record.sealed_tokens]
        del compacted.sealed_tokens[:]
        compacted.staging_token = new_token()
        compacted.dirty = False
        compacted.compacted_metarange_id = "compacted-" + record.staging_token[:8]
        refs.set_branch_if(repo, compacted, kv.Equals(predicate))
        return CompactionResult(compacted.compacted_metarange_id, len(tokens))


class Clock:
    def __init__(self, now=1_700_000_000.0):
        self.now = now

    def __call__(self):
        return self.now
