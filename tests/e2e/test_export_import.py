"""`quarry store export` / `quarry store import` (the CLI's entry point, run as a child would see
it: support.cli) over SQLite stores: a repository with branches, tags, commits, merge hints,
staged changes and a sealed token comes back identical in a fresh store, whatever format
version the source store is stamped with. (tests/e2e/test_format_rebuild.py runs this
build's services as processes on a rebuilt store.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from quarry import FORMAT_VERSION, exporting
from quarry.blob import LocalBlobStore
from quarry.committed import CommittedManager
from quarry.errors import QuarryError
from quarry.graveler.graveler import MERGE_HINTS_PREFIX, Graveler
from quarry.graveler.model import Entry
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import staging_partition
from quarry.kv.sqlite import SQLiteStore
from quarry.runtime import format_version
from support import cli
from support.processes import quarry_env


def run_quarry(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`quarry ARGS`: its entry point, in this process as a child would see it (support.cli),
    with a QUARRY_HOME of the test's own."""
    return cli.run_quarry(args, quarry_env(tmp_path / "home"))


def entry(path: str, version: int = 0) -> Entry:
    return Entry(
        path,
        f"s3://lake/{path}@{version}",
        10 + version,
        f"sum-{path}-{version}",
        metadata={"v": str(version)},
    )


def graveler_over(path) -> tuple[Graveler, SQLiteStore]:
    committed = CommittedManager(LocalBlobStore, None)
    store = SQLiteStore(path)
    return Graveler(store, committed, committed), store


def build_source(tmp_path):
    g, store = graveler_over(tmp_path / "source.db")
    g.create_repository("demo", str(tmp_path / "lake"))
    g.put_objects("demo", "main", [entry(f"data/{i:03d}.parquet") for i in range(30)])
    g.commit("demo", "main", "first", committer="alice", metadata={"k": "v"})
    g.create_branch("demo", "dev", "main")
    g.put_objects("demo", "dev", [entry("data/005.parquet", 1), entry("dev/only.parquet")])
    g.commit("demo", "dev", "on dev")
    g.create_tag("demo", "v1", "main")
    g.put_objects("demo", "main", [entry("data/100.parquet")])
    g.commit("demo", "main", "second")
    # Uncommitted on main: a write sealed by a commit that never finished, then newer writes
    # and a delete in the fresh staging token.
    repo = g.refs.get_repository("demo")
    g.put_objects("demo", "main", [entry("sealed/a.parquet"), entry("data/001.parquet", 7)])
    g.commits.seal(repo, "main")
    g.put_objects("demo", "main", [entry("staged/b.parquet", 2)])
    g.delete_objects("demo", "main", ["data/002.parquet"])
    g.merges.remember_hint(repo, "metarange-x", ("source", "base", "onto"))
    g.create_repository("empty", str(tmp_path / "lake2"))
    branch = g.get_branch("demo", "main")
    assert branch.sealed_tokens and branch.staging_token
    return g, store


def snapshot(g: Graveler) -> dict:
    def entries(items):
        return [
            (e.path, e.physical_address, e.size_bytes, e.checksum, dict(e.metadata)) for e in items
        ]

    result: dict = {
        "repos": sorted(
            (r.name, r.storage_namespace, r.default_branch, r.instance_id, r.creation_time)
            for r in g.list_repositories(page_size=1000)[0]
        )
    }
    for name in ("demo", "empty"):
        branches = g.list_branches(name, page_size=1000)[0]
        result[name, "branches"] = [b.SerializeToString(deterministic=True) for b in branches]
        result[name, "tags"] = [
            t.SerializeToString(deterministic=True) for t in g.list_tags(name, page_size=1000)[0]
        ]
        for b in branches:
            objects, prefixes, _ = g.list_objects(name, b.name, page_size=10_000)
            result[name, b.name, "ls"] = entries(objects)
            result[name, b.name, "ls/"] = g.list_objects(name, b.name, delimiter="/")[1]
            result[name, b.name, "log"] = [
                c.SerializeToString(deterministic=True)
                for c in g.log(name, b.name, page_size=1000)[0]
            ]
            changes = g.diff_uncommitted(name, b.name, page_size=1000)[0]
            result[name, b.name, "uncommitted"] = [
                (c.type, c.path, entries([c.entry]) if c.entry else None) for c in changes
            ]
    for path in (
        "sealed/a.parquet",
        "staged/b.parquet",
        "data/001.parquet",
        "data/005.parquet",
        "data/100.parquet",
    ):
        for ref in ("main", "dev", "v1", "main@"):
            try:
                result["stat", ref, path] = entries([g.stat_object("demo", ref, path)])
            except QuarryError as exc:  # not found on that ref: compare the error kind
                result["stat", ref, path] = type(exc).__name__
    return result


def test_export_import_round_trip(tmp_path):
    g, store = build_source(tmp_path)
    before = snapshot(g)
    assert before["demo", "main", "uncommitted"]
    assert before["stat", "main", "sealed/a.parquet"] != "ObjectNotFound"
    store.close()

    dump = tmp_path / "dump.jsonl"
    result = run_quarry(
        tmp_path, "store", "export", str(dump), "--kv-url", f"sqlite:///{tmp_path / 'source.db'}"
    )
    assert result.returncode == 0, result.stderr
    lines = dump.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["quarry_export"] == 1 and header["format_version"] is None
    assert json.loads(lines[-1])["type"] == "end"

    target = tmp_path / "target.db"
    result = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{target}")
    assert result.returncode == 0, result.stderr
    assert "imported 2 repositories" in result.stderr

    g2, store2 = graveler_over(target)
    assert snapshot(g2) == before
    assert (
        store2.get(format_version.PARTITION, format_version.KEY).value
        == str(FORMAT_VERSION).encode()
    )
    repo = g2.refs.get_repository("demo")
    assert (
        store2.get(repo.partition, MERGE_HINTS_PREFIX + b"metarange-x").value
        == b"source\nbase\nonto"
    )
    branch = g2.get_branch("demo", "main")
    sealed = list(store2.scan(staging_partition(branch.sealed_tokens[0])))
    assert sealed
    # The imported store is live: writes and commits work on it.
    g2.put_objects("demo", "main", [entry("after/import.parquet")])
    g2.commit("demo", "main", "after import")
    assert g2.stat_object("demo", "main@", "sealed/a.parquet").checksum == "sum-sealed/a.parquet-0"


def test_users_credentials_and_policies_come_along_into_a_store_without_its_own(tmp_path):
    """The auth partition is in the export (a private file: password hashes, sealed S3
    secrets); import writes it into a store with no identities of its own, where the same
    access key authenticates, and never merges it into one that has its own."""
    import stat

    from quarry.auth.store import IamStore
    from quarry.kv.partitions import AUTH_PARTITION
    from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY, setup_test_admin

    g, store = build_source(tmp_path)
    setup_test_admin(store)
    IamStore(store).create_user("alice", "alice@example.com")
    identities = list(store.scan(AUTH_PARTITION))
    store.close()
    dump = tmp_path / "dump.jsonl"
    source = f"sqlite:///{tmp_path / 'source.db'}"
    result = run_quarry(tmp_path, "store", "export", str(dump), "--kv-url", source)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600

    fresh = tmp_path / "fresh.db"
    result = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{fresh}")
    assert result.returncode == 0, result.stderr
    imported = SQLiteStore(fresh)
    assert list(imported.scan(AUTH_PARTITION)) == identities
    iam = IamStore(imported)
    assert iam.authenticate(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).user_id == "admin"
    assert iam.get_user("alice").email == "alice@example.com"
    imported.close()

    own = SQLiteStore(tmp_path / "own.db")
    IamStore(own).create_user("bob")
    theirs = list(own.scan(AUTH_PARTITION))
    own.close()
    result = run_quarry(
        tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{tmp_path / 'own.db'}"
    )
    assert result.returncode == 0, result.stderr
    assert f"not imported: {len(identities)} identity records" in result.stderr
    own = SQLiteStore(tmp_path / "own.db")
    assert list(own.scan(AUTH_PARTITION)) == theirs  # untouched: no alice, no admin
    own.close()


def test_export_reads_a_store_of_another_format_version(tmp_path):
    g, store = build_source(tmp_path)
    store.set(format_version.PARTITION, format_version.KEY, b"999")
    store.close()
    dump = tmp_path / "dump.jsonl"
    result = run_quarry(
        tmp_path, "store", "export", str(dump), "--kv-url", f"sqlite:///{tmp_path / 'source.db'}"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(dump.read_text().splitlines()[0])["format_version"] == "999"
    assert "storage format 999" in result.stderr


def test_an_export_from_a_newer_format_is_never_taken_back_to_this_one(tmp_path):
    """It was imported and stamped with this build's version (a silent downgrade), and the
    start-up refusal for a newer store recommended exactly that path."""
    g, store = build_source(tmp_path)
    newer = str(FORMAT_VERSION + 1).encode()
    store.set(format_version.PARTITION, format_version.KEY, newer)
    with pytest.raises(format_version.FormatVersionMismatch) as refused:
        format_version.ensure_format_version(store)
    assert "newer build" in refused.value.message and "export" not in refused.value.message
    store.close()
    dump = tmp_path / "dump.jsonl"
    url = f"sqlite:///{tmp_path / 'source.db'}"
    assert run_quarry(tmp_path, "store", "export", str(dump), "--kv-url", url).returncode == 0
    result = run_quarry(
        tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{tmp_path / 'new.db'}"
    )
    assert result.returncode == 1
    assert "FORMAT_VERSION_MISMATCH" in result.stderr and "newer" in result.stderr
    target = SQLiteStore(tmp_path / "new.db")
    assert list(exporting._repositories(target)) == []  # nothing imported
    target.close()


def test_import_refuses_a_non_empty_store(tmp_path):
    g, store = build_source(tmp_path)
    store.close()
    dump = tmp_path / "dump.jsonl"
    url = f"sqlite:///{tmp_path / 'source.db'}"
    assert run_quarry(tmp_path, "store", "export", str(dump), "--kv-url", url).returncode == 0
    result = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", url)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "quarry store import: STORE_NOT_EMPTY: the target KV store already holds repository "
        "'demo'; import needs an empty store"
    ]


def test_import_refuses_a_store_stamped_with_another_version(tmp_path):
    g, store = build_source(tmp_path)
    store.close()
    dump = tmp_path / "dump.jsonl"
    assert (
        run_quarry(
            tmp_path,
            "store",
            "export",
            str(dump),
            "--kv-url",
            f"sqlite:///{tmp_path / 'source.db'}",
        ).returncode
        == 0
    )
    other = SQLiteStore(tmp_path / "other.db")
    other.set(format_version.PARTITION, format_version.KEY, b"999")
    other.close()
    result = run_quarry(
        tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{tmp_path / 'other.db'}"
    )
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "FORMAT_VERSION_MISMATCH" in result.stderr


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad-base64", "not-utf8", "empty"])
def test_a_corrupt_file_gives_a_one_line_error(tmp_path, damage):
    g, store = build_source(tmp_path)
    store.close()
    dump = tmp_path / "dump.jsonl"
    assert (
        run_quarry(
            tmp_path,
            "store",
            "export",
            str(dump),
            "--kv-url",
            f"sqlite:///{tmp_path / 'source.db'}",
        ).returncode
        == 0
    )
    lines = dump.read_text().splitlines(keepends=True)
    if damage == "garbage":
        lines.insert(3, "{not json\n")
        dump.write_text("".join(lines))
    elif damage == "truncated":
        dump.write_text("".join(lines[:-3]))
    elif damage == "bad-base64":
        item = json.loads(lines[2])
        item["value"] = "!!!"
        lines[2] = json.dumps(item) + "\n"
        dump.write_text("".join(lines))
    elif damage == "not-utf8":
        dump.write_bytes(b"\xff\xfe\x00garbage\n")
    else:
        dump.write_text("")
    target = tmp_path / "target.db"
    result = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{target}")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "CORRUPT_EXPORT" in result.stderr
    assert "Traceback" not in result.stderr
    # Nothing visible was imported: the store still accepts a clean import.
    g2, store2 = graveler_over(target)
    assert g2.list_repositories()[0] == []
    store2.close()


def test_progress_is_reported_by_count(tmp_path, monkeypatch):
    import io

    g, store = build_source(tmp_path)
    monkeypatch.setattr(exporting, "PROGRESS_EVERY", 5)
    monkeypatch.setattr(exporting, "BATCH_SIZE", 3)
    seen: list[int] = []
    out = io.StringIO()
    summary = exporting.export_store(store, out, seen.append)
    assert summary.items >= 10 and seen == list(range(5, summary.items + 1, 5))
    target = MemoryStore()
    back: list[int] = []
    imported = exporting.import_store(target, io.StringIO(out.getvalue()), back.append)
    assert (imported.repositories, imported.items) == (2, summary.items) and back == seen
    store.close()


def test_the_installation_survives_a_rebuild(tmp_path):
    """The installation id and the records of deleted repositories travel with the export,
    so the namespace of a repository deleted before the rebuild stays reusable after it
    (its ownership marker names this installation), and a live one stays refused."""
    g, store = graveler_over(tmp_path / "source.db")
    g.create_repository("kept", str(tmp_path / "lake-kept"))
    g.create_repository("gone", str(tmp_path / "lake-gone"))
    g.delete_repository("gone")
    installation = g.installation_id()
    store.close()

    dump = tmp_path / "dump.jsonl"
    assert (
        run_quarry(
            tmp_path,
            "store",
            "export",
            str(dump),
            "--kv-url",
            f"sqlite:///{tmp_path / 'source.db'}",
        ).returncode
        == 0
    )
    target = tmp_path / "target.db"
    result = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", f"sqlite:///{target}")
    assert result.returncode == 0, result.stderr

    g2, store2 = graveler_over(target)
    try:
        assert g2.installation_id() == installation
        g2.create_repository("again", str(tmp_path / "lake-gone"))  # a deleted one's: reusable
        with pytest.raises(QuarryError) as refused:
            g2.create_repository("other", str(tmp_path / "lake-kept"))
        assert refused.value.reason == "NAMESPACE_IN_USE"
    finally:
        store2.close()


def test_an_unreadable_repository_record_is_a_corrupt_export(tmp_path):
    """A repository line whose record cannot be parsed is CORRUPT_EXPORT, naming the line
    (it once raised AttributeError: the import's line iterator shadowed the records
    module), and nothing is imported."""
    import base64
    import io

    g, store = build_source(tmp_path)
    out = io.StringIO()
    exporting.export_store(store, out)
    store.close()
    lines = out.getvalue().splitlines(keepends=True)
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if obj.get("type") == "repository":
            obj["value"] = base64.b64encode(b"\xff not a repository record").decode()
            lines[i] = json.dumps(obj) + "\n"
            break
    else:
        raise AssertionError("no repository line in the export")
    target = MemoryStore()
    with pytest.raises(exporting.CorruptExport, match="repository record cannot be read"):
        exporting.import_store(target, io.StringIO("".join(lines)))
    assert list(target.scan(b"quarry")) == []


def test_one_damaged_record_does_not_keep_the_rest_of_the_store_out_of_the_export(tmp_path):
    """A corrupt branch record aborted the whole export (no file for any repository). Now
    everything readable is exported, the damage is named (partition and key) and the
    command exits 1; a rebuild import of a damaged record names it too."""
    g, store = build_source(tmp_path)
    demo = g.refs.get_repository("demo")
    store.set(demo.partition, b"branches/dev", b"\x0b\xad\xbe\xef")
    store.set(b"quarry", b"repos/zzz", b"\xff not a repository record")
    store.close()
    dump = tmp_path / "dump.jsonl"
    url = f"sqlite:///{tmp_path / 'source.db'}"
    result = run_quarry(tmp_path, "store", "export", str(dump), "--kv-url", url)
    assert result.returncode == 1
    assert "branches/dev" in result.stderr and "repos/zzz" in result.stderr
    assert "Traceback" not in result.stderr
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    assert lines[-1].get("type") == "end"
    assert {x["name"] for x in lines if x.get("type") == "repository"} == {"demo", "empty"}
    # Importing it names the damaged record (it said only "line 4").
    target = f"sqlite:///{tmp_path / 'target.db'}"
    imported = run_quarry(tmp_path, "store", "import", str(dump), "--kv-url", target)
    assert imported.returncode == 1
    assert f"{demo.partition.decode()}/branches/dev" in imported.stderr
