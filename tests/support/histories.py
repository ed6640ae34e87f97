"""Building commit histories in the core for tests: a commit of puts and deletes."""

from __future__ import annotations

from typing import Any

from quarry.graveler.model import Entry


def entry(path: str, checksum: str = "c1") -> Entry:
    return Entry(path, f"data/{path}-{checksum}", 10, checksum)


def put_commit(g: Any, repo: str, branch: str, files: dict, message: str = "c") -> Any:
    """Commit `files` onto `branch`: path -> checksum puts an entry, path -> None deletes."""
    puts = [entry(p, c) for p, c in files.items() if c is not None]
    deletes = [p for p, c in files.items() if c is None]
    if puts:
        g.put_objects(repo, branch, puts)
    if deletes:
        g.delete_objects(repo, branch, deletes)
    return g.commit(repo, branch, message).commit
