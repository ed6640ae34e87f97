"""Fakes for the compaction unit tests."""

from quarry.compaction.sensor import CompactionResult
from quarry.graveler.staging import new_token


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

        def compact(record):
            record.compacted_metarange_id = "compacted-" + record.staging_token[:8]
            del record.sealed_tokens[:]
            record.staging_token = new_token()
            record.dirty = False
            return record

        update = refs.update_branch(repo, branch, compact, step="fake-compact")
        tokens = [update.before.staging_token, *update.before.sealed_tokens]
        return CompactionResult(update.branch.compacted_metarange_id, len(tokens))


class Clock:
    def __init__(self, now=1_700_000_000.0):
        self.now = now

    def __call__(self):
        return self.now
