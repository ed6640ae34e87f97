"""`quarry doctor` as a user runs it, against the whole suite running in this test
process (the command in process as a child would see it, support.cli). Problems are planted through the kv-gateway
(SetItem) and the storage namespace, as a bad disk or an operator's mistake leaves them."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from quarry.committed import format as rformat
from quarry.committed.metaranges import read_metarange
from quarry.graveler.refs import Repository
from quarry.kv.remote import RemoteStore
from quarry.v1 import types_pb2
from support.cli import run_quarry
from support.processes import quarry_env
from support.suite import suite_fixture

GARBAGE = b"\xff\xfe not a protobuf \x00\x01"


suite = suite_fixture()


@pytest.fixture(scope="module")
def kv(suite):
    store = RemoteStore(suite.targets["kv-gateway"])
    yield store
    store.close()


@pytest.fixture(scope="module")
def doctor(suite, tmp_path_factory):
    # doctor reads the KV store through the kv-gateway, logged in at the branch-manager.
    env = quarry_env(
        tmp_path_factory.mktemp("cli-home"),
        QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
    )

    def run(*args: str, expect: int) -> subprocess.CompletedProcess:
        result = run_quarry(["doctor", *args, "--kv-gateway", suite.targets["kv-gateway"]], env)
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def snapshot(kv, partitions) -> dict:
    return {p: [(i.key, i.value) for i in kv.scan(p)] for p in partitions}


def test_doctor_clean_then_planted_problems(suite, kv, doctor):
    client = suite.client()
    repos = {}
    for name in ("alpha", "beta"):
        repos[name] = client.create_repository(name, suite.namespace(name))
        client.put_object(name, "main", path="a/1", physical_address="s3://b/1", size_bytes=1)
        client.commit(name, "main", "first")
        client.create_branch(name, "dev", "main")
        client.put_object(name, "dev", path="a/2", physical_address="s3://b/2", size_bytes=2)
        client.create_tag(name, "v1", "main")

    # A healthy installation: exit 0, nothing found, and the checks did look at things.
    clean = json.loads(doctor("--json", expect=0).stdout)
    assert clean["ok"] is True and clean["findings"] == []
    assert clean["checked"]["repositories"] == 2 and clean["checked"]["commits"] == 4
    assert clean["checked"]["ranges"] >= 2
    assert "no problems found" in doctor(expect=0).stdout

    # Plant problems.
    record = kv.get(b"quarry", b"repos/alpha").value
    alpha = Repository.from_record(record, b"repos/alpha").partition
    missing = "f" * 64
    kv.set(b"quarry", b"repos/zzz", GARBAGE)
    kv.set(
        alpha,
        b"branches/lost",
        types_pb2.Branch(
            name="lost", commit_id=missing, staging_token=uuid.uuid4().hex
        ).SerializeToString(),
    )
    kv.set(alpha, b"tags/v0", types_pb2.Tag(name="v0", commit_id=missing).SerializeToString())
    dev_token = client.get_branch("alpha", "dev").staging_token
    kv.set(f"staging/{dev_token}".encode(), b"a/9", GARBAGE)
    orphan = f"staging/orphan-{uuid.uuid4().hex}".encode()
    kv.set(orphan, b"x", types_pb2.StagedValue(tombstone=True).SerializeToString())
    # beta: a range file of its head commit goes missing.
    beta_head = client.get_commit("beta", "main")
    ranges = read_metarange(_namespace_store(suite, "beta"), beta_head.metarange_id)
    range_file = os.path.join(suite.namespace("beta"), rformat.range_key(ranges[0].id))
    os.remove(range_file)

    watched = [b"quarry", alpha, b"cleanup", orphan, f"staging/{dev_token}".encode()]
    before = snapshot(kv, watched)
    result = doctor("--json", expect=1)
    report = json.loads(result.stdout)
    assert report["ok"] is False
    found = {(f["kind"], f["partition"], f["key"]) for f in report["findings"]}
    alpha_name = alpha.decode()
    assert ("corrupt_record", "quarry", "repos/zzz") in found
    assert ("branch_missing_commit", alpha_name, "branches/lost") in found
    assert ("tag_missing_commit", alpha_name, "tags/v0") in found
    assert ("corrupt_record", f"staging/{dev_token}", "a/9") in found
    assert ("orphan_staging_token", orphan.decode(), "") in found
    objects = {(f["kind"], f["object"]) for f in report["findings"]}
    assert ("metarange_missing_range", range_file) in objects
    assert len(report["findings"]) == 6, report["findings"]
    # Read-only: nothing it looked at changed.
    assert snapshot(kv, watched) == before

    # Human output names each one; one repository narrows the check to it.
    text = doctor(expect=1).stdout
    assert "repos/zzz" in text and "branches/lost" in text and range_file in text
    assert "6 problem(s)" in text
    beta_only = json.loads(doctor("beta", "--json", expect=1).stdout)
    assert [f["kind"] for f in beta_only["findings"]] == ["metarange_missing_range"]
    doctor("nope", expect=1)  # NOT_FOUND, one line on stderr
    kv.delete(
        b"quarry", b"repos/zzz"
    )  # the installation-wide damage: later tests create repositories


def _namespace_store(suite, name):
    from quarry.blob import open_blob_store

    return open_blob_store(suite.namespace(name))


def test_doctor_reports_a_corrupt_or_parked_cleanup_item(kv, doctor):
    key = f"staging/garbage-{uuid.uuid4().hex}"
    kv.set(b"cleanup", key.encode(), GARBAGE)
    report = json.loads(doctor("--json", expect=1).stdout)
    # Depending on whether a dropper pass ran meanwhile: still queued (corrupt) or parked.
    assert {(f["kind"], f["key"]) for f in report["findings"]} & {
        ("corrupt_record", key),
        ("parked_cleanup_item", f"parked/{key}"),
    }


def test_listing_commands_warn_about_skipped_records(suite, kv, tmp_path):
    client = suite.client()
    client.create_repository("gamma", suite.namespace("gamma"))
    client.create_branch("gamma", "ok", "main")
    partition = Repository.from_record(
        kv.get(b"quarry", b"repos/gamma").value, b"repos/gamma"
    ).partition
    kv.set(partition, b"branches/broken", GARBAGE)
    result = run_quarry(
        [
            "branch",
            "list",
            "gamma",
            "--branch-manager",
            suite.targets["branch-manager"],
            "--committer",
            suite.targets["committer"],
        ],
        quarry_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["main", "ok"]
    assert "skipped 1 corrupt record" in result.stderr and "quarry doctor" in result.stderr


def test_doctor_finds_broken_history_and_a_live_token_queued_for_drop(suite, kv, doctor):
    import time

    from quarry.v1 import records_pb2

    client = suite.client()
    client.create_repository("delta", suite.namespace("delta"))
    partition = Repository.from_record(
        kv.get(b"quarry", b"repos/delta").value, b"repos/delta"
    ).partition
    orphan_commit, missing_parent, missing_metarange = "1" * 64, "2" * 64, "3" * 64
    kv.set(
        partition,
        f"commits/{orphan_commit}".encode(),
        types_pb2.Commit(
            id=orphan_commit, parents=[missing_parent], metarange_id=missing_metarange, generation=2
        ).SerializeToString(),
    )
    # A tag makes it a commit reads reach: its missing metarange is a finding. Another
    # commit no branch or tag points at, whose metarange is missing too, is what a GC
    # leaves (it deletes expired commits' metaranges): counted, not a finding.
    from quarry.graveler import layout

    kv.set(
        partition,
        layout.tag_key("broken"),
        types_pb2.Tag(name="broken", commit_id=orphan_commit).SerializeToString(),
    )
    collected = "4" * 64
    kv.set(
        partition,
        f"commits/{collected}".encode(),
        types_pb2.Commit(
            id=collected, parents=[], metarange_id="5" * 64, generation=1
        ).SerializeToString(),
    )
    token = client.get_branch("delta", "main").staging_token
    # Queued far in the future, so this suite's dropper leaves it alone during the test.
    kv.set(
        b"cleanup",
        f"staging/{token}".encode(),
        records_pb2.CleanupRecord(
            partition_key=f"staging/{token}", queued_at=int(time.time()) + 3600
        ).SerializeToString(),
    )
    try:
        report = json.loads(doctor("delta", "--json", expect=1).stdout)
        kinds = {(f["kind"], f["key"]) for f in report["findings"]}
        assert kinds == {
            ("commit_missing_parent", f"commits/{orphan_commit}"),
            ("missing_metarange", f"commits/{orphan_commit}"),
        }
        assert report["checked"]["metaranges of unanchored commits missing (GC collects them)"] == 1
        everything = json.loads(doctor("--json", expect=1).stdout)
        assert ("staging_token_in_use_but_queued_for_drop", f"staging/{token}") in {
            (f["kind"], f["key"]) for f in everything["findings"]
        }
    finally:
        kv.delete(b"cleanup", f"staging/{token}".encode())


def test_doctor_finds_a_repository_whose_default_branch_is_gone(suite, kv, doctor):
    """A repository record left over an emptied instance (tester hAJ: an older build's
    dropper deleted a live repository's partition; `ls REPO main` failed with REF_NOT_FOUND
    and doctor said "no problems found")."""
    from quarry.graveler import layout

    client = suite.client()
    client.create_repository("emptied", suite.namespace("emptied"))
    partition = Repository.from_record(
        kv.get(b"quarry", b"repos/emptied").value, b"repos/emptied"
    ).partition
    doctor("emptied", expect=0)
    kv.delete(partition, layout.branch_key("main"))
    report = json.loads(doctor("emptied", "--json", expect=1).stdout)
    assert [(f["kind"], f["key"]) for f in report["findings"]] == [
        ("default_branch_missing", "branches/main")
    ]


def test_doctor_finds_damaged_range_files_and_a_lost_ownership_marker(suite, doctor):
    """Found by a tester with nothing reported: a truncated range file (reads fail with
    RANGE_CORRUPT), a range file overwritten in place with another valid range (reads served
    the other object's entries), and a namespace whose marker was moved away (GC refuses the
    repository)."""
    from quarry.blob.layout import MARKER_KEY

    client = suite.client()
    for name in ("torn", "swapped", "unowned"):
        client.create_repository(name, suite.namespace(name))
        client.put_object(name, "main", path="a/1", physical_address="s3://b/1", size_bytes=1)
        client.commit(name, "main", "first")
        client.create_tag(name, "v1", "main")
    client.put_object("swapped", "main", path="a/1", physical_address="s3://b/2", size_bytes=2)
    client.commit("swapped", "main", "second")

    def range_file(name, ref):
        store = _namespace_store(suite, name)
        (info,) = read_metarange(store, client.get_commit(name, ref).metarange_id)
        return os.path.join(suite.namespace(name), rformat.range_key(info.id))

    torn = range_file("torn", "main")
    with open(torn, "r+b") as damaged:
        damaged.truncate(100)
    first, second = range_file("swapped", "v1"), range_file("swapped", "main")
    with open(second, "rb") as src, open(first, "wb") as dst:
        dst.write(src.read())  # valid Parquet, a valid range: not the one its id names
    marker = os.path.join(suite.namespace("unowned"), MARKER_KEY)
    os.rename(marker, marker + ".moved")
    try:
        found = {}
        for name in ("torn", "swapped", "unowned"):
            report = json.loads(doctor(name, "--json", expect=1).stdout)
            found[name] = {(f["kind"], f["object"]) for f in report["findings"]}
        assert found["torn"] == {("unreadable_range", torn)}
        assert found["swapped"] == {("range_content_mismatch", first)}
        assert found["unowned"] == {("namespace_not_owned", marker)}
    finally:
        os.rename(marker + ".moved", marker)


def test_an_unreachable_kv_gateway_is_named_with_its_flag(suite, tmp_path_factory):
    """It said "cannot reach the service at ipv4:..." (doctor dials the kv-gateway itself)."""
    import socket

    env = quarry_env(
        tmp_path_factory.mktemp("cli-home"),
        QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
    )
    with socket.socket() as held:  # bound, never listening: refused, and no one else gets it
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        result = run_quarry(["doctor", "--kv-gateway", f"127.0.0.1:{port}"], env)
    assert result.returncode == 1
    assert f"cannot reach the kv-gateway at 127.0.0.1:{port}" in result.stderr, result.stderr
    assert "--kv-gateway" in result.stderr and "Traceback" not in result.stderr
