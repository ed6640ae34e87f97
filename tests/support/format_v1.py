"""A genuine storage-format-1 store, for tests of the rebuild path (issue 10.1).

Run as a script, in a child process of its own:

    python tests/support/format_v1.py KV_DB HOME SNAPSHOT_JSON

Before importing the rest of the library it turns this process into the previous build:
`quarry.FORMAT_VERSION = 1` (from which the range/metarange format tags, their id headers
and the KV stamp derive), format 1's identity rule, which left the physical address out,
and format 1's flat metaranges (one file naming every range: no index pages, format 3).
Then it starts the services in-process over loopback (support.suite) on a SQLite store,
writes a history through the client — commits, a merge, tags, branches, a compacted branch,
staged and deleted entries, several ranges per metarange, a merge hint — and writes the
`snapshot` of
everything a user reads back to SNAPSHOT_JSON. What it leaves is what the format-1 build
wrote: a store stamped "1" and namespaces of `range/v1` / `metarange/v1` files.

`snapshot` is shared with the test, which takes it again after `quarry store import`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

REPOSITORIES = ("demo", "second", "empty")
MAIN_ENTRIES = 3000  # about three ranges of the default target size


def v1_entry_identity(
    physical_address: str,
    size_bytes: int,
    checksum: str,
    content_type: str,
    metadata: Iterable[tuple[str, str]],
) -> bytes:
    """Format 1's identity: SHA-256 over size, checksum, content type and sorted metadata —
    NOT the physical address (the rule that lost re-pointed writes)."""
    parts = [str(int(size_bytes)).encode(), checksum.encode(), content_type.encode()]
    for key, value in sorted(metadata):
        parts.append(key.encode())
        parts.append(value.encode())
    framed = b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hashlib.sha256(framed).digest()


def become_format_v1() -> None:
    import quarry

    if "quarry.committed.format" in sys.modules:
        raise RuntimeError("become_format_v1 must run before the library is imported")
    quarry.FORMAT_VERSION = 1
    from quarry.graveler import model

    model.entry_identity = v1_entry_identity
    from quarry.committed import metaranges  # (after the identity rule: it imports users)

    # Every metarange one page: stored flat, as format 1 stored every metarange.
    metaranges.is_page_end = lambda info: False
    metaranges.PAGE_MAX_RANGES = sys.maxsize


# ---- what a user reads back ---------------------------------------------------------------


def entry_fields(entry) -> list:
    return [
        entry.path,
        entry.physical_address,
        entry.size_bytes,
        entry.checksum,
        entry.mtime.ToMicroseconds() if entry.HasField("mtime") else 0,
        entry.content_type,
        dict(sorted(entry.metadata.items())),
    ]


def snapshot(client) -> dict:
    """Every field a user reads back, per repository: branches, tags, the log of every
    branch with every commit's full listing, listings of branches (staging included) and
    tags, uncommitted changes. Metarange ids are left out (a rebuild changes them); see
    `metarange_ids`."""
    out: dict = {}
    for repo in REPOSITORIES:
        r = client.get_repository(repo)
        data: dict = {
            "repository": [
                r.name,
                r.storage_namespace,
                r.default_branch,
                r.creation_time.ToMicroseconds(),
            ]
        }
        data["branches"] = {
            b.name: [
                b.commit_id,
                b.staging_token,
                list(b.sealed_tokens),
                bool(b.compacted_metarange_id),
            ]
            for b in client.iter_branches(repo)
        }
        data["tags"] = {t.name: t.commit_id for t in client.iter_tags(repo)}
        commits: dict = {}
        for branch in data["branches"]:
            data[f"log {branch}"] = [c.id for c in client.iter_log(repo, branch)]
            for c in client.iter_log(repo, branch):
                commits[c.id] = [
                    list(c.parents),
                    c.message,
                    c.committer,
                    c.creation_time.ToMicroseconds(),
                    dict(c.metadata),
                    c.generation,
                ]
            data[f"uncommitted {branch}"] = [
                [c.type, c.path, entry_fields(c.entry) if c.HasField("entry") else None]
                for c in client.iter_uncommitted(repo, branch)
            ]
        data["commits"] = commits
        refs = [*data["branches"], *(f"{b}@" for b in data["branches"]), *data["tags"], *commits]
        for ref in refs:
            data[f"ls {ref}"] = [entry_fields(e) for e in client.iter_objects(repo, ref)]
        out[repo] = data
    return out


def metarange_ids(client) -> dict:
    """repository -> sorted metarange ids of its commits and compacted branches."""
    ids: dict = {}
    for repo in REPOSITORIES:
        found = set()
        for branch in client.iter_branches(repo):
            if branch.compacted_metarange_id:
                found.add(branch.compacted_metarange_id)
            found.update(c.metarange_id for c in client.iter_log(repo, branch.name))
        ids[repo] = sorted(found)
    return ids


# ---- the history ----------------------------------------------------------------------------


def main_entry(i: int, version: int = 0) -> dict:
    """Every field varied across entries: empty and non-empty checksums, content types,
    metadata of zero to two keys, mtimes."""
    return dict(
        path=f"data/{i:05d}.parquet",
        physical_address=f"s3://lake/data/{i:05d}-v{version}.parquet",
        size_bytes=1000 + i + version,
        checksum="" if i % 3 == 0 else f"sum{i}-{version}",
        mtime=1_700_000_000 + i + version * 1000,
        content_type=("application/parquet", "", "text/csv")[i % 3],
        metadata={}
        if i % 4 == 0
        else {"part": str(i % 7), **({"é-key": f"v{version}"} if i % 4 == 3 else {})},
    )


def write_history(client, home: Path) -> None:
    def namespace(repo: str) -> str:
        path = home / "lake" / repo
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    client.create_repository("demo", namespace("demo"))
    client.put_objects("demo", "main", [main_entry(i) for i in range(MAIN_ENTRIES)])
    client.commit("demo", "main", "first", committer="alice", metadata={"k": "v"})
    client.create_branch("demo", "dev", "main")
    client.put_objects(
        "demo",
        "dev",
        [
            main_entry(5, 1),
            main_entry(2500, 1),
            dict(path="dev/only.parquet", physical_address="s3://lake/dev/only", size_bytes=7),
        ],
    )
    client.commit("demo", "dev", "on dev", committer="bob")
    client.create_tag("demo", "v1", "main")
    client.put_objects("demo", "main", [main_entry(MAIN_ENTRIES + 1)])
    client.delete_objects("demo", "main", ["data/00010.parquet"])
    client.commit("demo", "main", "second")
    client.merge("demo", "dev", "main", message="merge dev", committer="carol")
    # A compacted branch: changes folded into a compacted metarange, then more staged.
    client.create_branch("demo", "compacted", "main")
    client.put_objects("demo", "compacted", [main_entry(i, 2) for i in range(100, 160)])
    client.delete_objects("demo", "compacted", [f"data/{i:05d}.parquet" for i in range(200, 220)])
    assert client.compact("demo", "compacted").compacted_metarange_id
    client.put_objects("demo", "compacted", [main_entry(150, 3), main_entry(9999)])
    client.delete_objects("demo", "compacted", ["data/00101.parquet"])
    # Uncommitted on main: a changed, an added and a deleted entry.
    client.put_objects(
        "demo",
        "main",
        [
            main_entry(1, 4),
            dict(
                path="staged/b.parquet",
                physical_address="s3://lake/staged/b",
                size_bytes=3,
                metadata={"staged": "yes"},
            ),
        ],
    )
    client.delete_objects("demo", "main", ["data/00002.parquet"])

    client.create_repository("second", namespace("second"), default_branch="trunk")
    client.put_objects("second", "trunk", [main_entry(i) for i in range(5)])
    client.commit("second", "trunk", "only commit")
    client.create_repository("empty", namespace("empty"))


MERGE_HINT_VALUE = b"dev\nbase\nmain"


def plant_merge_hint(backend, client) -> None:
    """A merge hint as a merge retry leaves one (`mergehints/<result metarange id>`): it
    names a format-1 metarange id, so the rebuild must drop it."""
    from quarry.graveler.graveler import MERGE_HINTS_PREFIX
    from quarry.graveler.refs import REPOS_PREFIX, Repository

    repo = Repository.from_record(
        backend.get(b"quarry", REPOS_PREFIX + b"demo").value, REPOS_PREFIX + b"demo"
    )
    head = client.get_commit("demo", "main")
    backend.set(repo.partition, MERGE_HINTS_PREFIX + head.metarange_id.encode(), MERGE_HINT_VALUE)


def main(argv: list[str]) -> int:
    db, home, snapshot_path = argv
    become_format_v1()
    import quarry
    from quarry.kv.sqlite import SQLiteStore
    from support.suite import running_suite

    assert quarry.FORMAT_VERSION == 1
    backend = SQLiteStore(db)
    try:
        with running_suite(Path(home), backend=backend) as suite:
            client = suite.client()
            try:
                write_history(client, Path(home))
                plant_merge_hint(backend, client)
                Path(snapshot_path).write_text(
                    json.dumps({"snapshot": snapshot(client), "metaranges": metarange_ids(client)})
                )
            finally:
                client.close()
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
