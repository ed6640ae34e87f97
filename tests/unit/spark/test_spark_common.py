"""What the Spark driver and executors share (quarry.spark.common): URIs, job and ephemeral
branch names, the picklable Connection. No Spark session."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pickle
import re

import pytest

from quarry import errors
from quarry.config import load_settings
from quarry.graveler.names import check_branch_name
from quarry.spark.common import (
    EPHEMERAL_PREFIX,
    SCHEME,
    Connection,
    InvalidQuarryUri,
    QuarryUri,
    ephemeral_branch,
    ephemeral_created_at,
    job_of_branch,
    new_job_id,
    parse_uri,
)

UTC = dt.UTC

# --- parse_uri -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, repository, ref, path",
    [
        ("quarry://lake/main/tables/t1", "lake", "main", "tables/t1"),
        ("quarry://lake/main/tables/t1/", "lake", "main", "tables/t1/"),
        ("quarry://lake/main", "lake", "main", ""),
        ("quarry://lake/main/", "lake", "main", ""),
        ("quarry://lake/main/a/b/c/part-0.parquet", "lake", "main", "a/b/c/part-0.parquet"),
        ("quarry://lake/main//tables", "lake", "main", "tables"),
        ("quarry://lake/v1.0/x", "lake", "v1.0", "x"),
        ("quarry://lake/main~1/x", "lake", "main~1", "x"),
        ("quarry://lake/main~2/", "lake", "main~2", ""),
        ("quarry://lake/main@/x", "lake", "main@", "x"),
        ("quarry://lake/a1b2c3d4e5f6/x", "lake", "a1b2c3d4e5f6", "x"),
        ("quarry://lake/main/my%20table/a%2Bb.csv", "lake", "main", "my table/a+b.csv"),
        ("quarry://lake/main/caf%C3%A9/x", "lake", "main", "café/x"),
        ("quarry://lake/main%7E1/x", "lake", "main~1", "x"),
    ],
)
def test_parse_uri(uri, repository, ref, path):
    parsed = parse_uri(uri)
    assert parsed == QuarryUri(repository, ref, path)
    assert (parsed.repository, parsed.ref, parsed.path) == (repository, ref, path)


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "lake/main/x",
        "s3://lake/main/x",
        "quarry:/lake/main/x",
        "quarry:lake/main/x",
        "quarry://",
        "quarry://lake",
        "quarry://lake/",
        "quarry://lake//x",
        "quarry:///main/x",
        "quarry:////",
        None,
        42,
        b"quarry://lake/main/x",
    ],
)
def test_parse_uri_rejects(uri):
    with pytest.raises(InvalidQuarryUri) as info:
        parse_uri(uri)
    assert info.value.reason == "INVALID_QUARRY_URI"
    assert isinstance(info.value, errors.InvalidArgument)


@pytest.mark.parametrize(
    "path, prefix",
    [
        ("", ""),
        ("/", ""),
        ("tables/t1", "tables/t1/"),
        ("tables/t1/", "tables/t1/"),
        ("/tables/t1//", "tables/t1/"),
        ("x", "x/"),
    ],
)
def test_prefix(path, prefix):
    assert QuarryUri("lake", "main", path).prefix == prefix


def test_prefix_from_parsed_uris():
    assert parse_uri("quarry://lake/main").prefix == ""
    assert parse_uri("quarry://lake/main/tables/t1").prefix == "tables/t1/"
    assert parse_uri("quarry://lake/main/tables/t1/").prefix == "tables/t1/"


@pytest.mark.parametrize(
    "uri",
    ["quarry://lake/main/tables/t1", "quarry://lake/main~1/", "quarry://lake/v1.0/a/b.parquet"],
)
def test_str_round_trip(uri):
    parsed = parse_uri(uri)
    assert str(parsed) == uri
    assert parse_uri(str(parsed)) == parsed
    assert str(parsed).startswith(SCHEME)


def test_quarry_uri_is_frozen_and_hashable():
    uri = parse_uri("quarry://lake/main/x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        uri.path = "y"  # type: ignore[misc]
    assert {uri, parse_uri("quarry://lake/main/x")} == {uri}


# --- job ids and ephemeral branches --------------------------------------------------------

JOB_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{12}$")


def test_new_job_id_format_and_time():
    now = dt.datetime(2024, 3, 5, 7, 8, 9, 123456, tzinfo=UTC)
    job = new_job_id(now)
    assert JOB_ID.match(job), job
    assert job.startswith("20240305T070809-")


def test_new_job_ids_are_unique():
    now = dt.datetime(2024, 3, 5, tzinfo=UTC)
    assert len({new_job_id(now) for _ in range(200)}) == 200


def test_new_job_id_defaults_to_utc_now():
    before = dt.datetime.now(UTC).replace(microsecond=0)
    created = ephemeral_created_at(ephemeral_branch(new_job_id()))
    after = dt.datetime.now(UTC)
    assert created is not None
    assert before <= created <= after
    assert created.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize(
    "now",
    [
        dt.datetime(2024, 3, 5, 7, 8, 9, 999999, tzinfo=UTC),
        dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        dt.datetime(2030, 1, 1, tzinfo=UTC),
    ],
)
def test_ephemeral_branch_round_trip(now):
    job = new_job_id(now)
    branch = ephemeral_branch(job)
    assert branch == EPHEMERAL_PREFIX + job
    assert ephemeral_created_at(branch) == now.replace(microsecond=0)
    assert ephemeral_created_at(branch).tzinfo is not None
    assert job_of_branch(branch) == job


@pytest.mark.parametrize(
    "name",
    [
        "main",
        "",
        "_quarry-spark-",
        "quarry-spark-20240305T070809-0123456789ab",
        "_quarry-spark-20240305T070809",
        "_quarry-spark-20240305T070809-0123456789a",  # 11 hex digits
        "_quarry-spark-20240305T070809-0123456789abc",  # 13 hex digits
        "_quarry-spark-20240305T070809-0123456789AB",  # upper case
        "_quarry-spark-20240305T070809-0123456789ag",
        "_quarry-spark-20240305-070809-0123456789ab",
        "_quarry-spark-20240305T070809-0123456789ab-x",
        "x_quarry-spark-20240305T070809-0123456789ab",
    ],
)
def test_ephemeral_created_at_of_other_names_is_none(name):
    assert ephemeral_created_at(name) is None


@pytest.mark.parametrize(
    "now", [dt.datetime(2024, 3, 5, 7, 8, 9, tzinfo=UTC), dt.datetime(2000, 1, 1, tzinfo=UTC)]
)
def test_ephemeral_branch_names_are_valid_branch_names(now):
    for _ in range(50):
        name = ephemeral_branch(new_job_id(now))
        assert check_branch_name(name) == name


# --- Connection ----------------------------------------------------------------------------


def test_connection_pickles():
    connection = Connection(
        "bm.example:7402",
        "committer.example:7403",
        "http://s3.example:9000",
        "eu-west-1",
        timeout=12.5,
    )
    again = pickle.loads(pickle.dumps(connection))
    assert again == connection
    assert again.timeout == 12.5 and again.s3_region == "eu-west-1"
    assert hash(again) == hash(connection)  # usable as a client-cache key


def test_connection_is_frozen():
    connection = Connection("a:1", "b:2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        connection.committer = "c:3"  # type: ignore[misc]
    assert connection.s3_endpoint_url == "" and connection.s3_region == "us-east-1"
    assert connection.timeout == 60.0


def test_connection_from_settings_defaults(monkeypatch):
    monkeypatch.delenv("QUARRY_ACCESS_KEY_ID", raising=False)  # no credentials anywhere
    monkeypatch.delenv("QUARRY_SECRET_ACCESS_KEY", raising=False)
    settings = load_settings(env={})
    connection = Connection.from_settings(settings)
    assert connection == Connection(
        settings.branch_manager_address,
        settings.committer_address,
        settings.s3_endpoint_url,
        settings.s3_region,
    )
    assert connection.branch_manager == "127.0.0.1:7402"
    assert connection.committer == "127.0.0.1:7403"


def test_connection_from_settings_takes_the_settings_addresses(monkeypatch):
    monkeypatch.delenv("QUARRY_ACCESS_KEY_ID", raising=False)  # no credentials anywhere
    monkeypatch.delenv("QUARRY_SECRET_ACCESS_KEY", raising=False)
    settings = load_settings(
        env={},
        branch_manager_address="bm.svc:1234",
        committer_address="committer.svc:5678",
        s3_endpoint_url="http://minio:9000",
        s3_region="eu-central-1",
    )
    assert Connection.from_settings(settings) == Connection(
        "bm.svc:1234", "committer.svc:5678", "http://minio:9000", "eu-central-1"
    )


def test_connection_from_settings_environment():
    settings = load_settings(
        env={
            "QUARRY_BRANCH_MANAGER_ADDRESS": "10.0.0.1:7402",
            "QUARRY_COMMITTER_ADDRESS": "10.0.0.2:7403",
        }
    )
    connection = Connection.from_settings(settings)
    assert (connection.branch_manager, connection.committer) == ("10.0.0.1:7402", "10.0.0.2:7403")


class _FakeConf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _FakeSpark:
    def __init__(self, values):
        self.conf = _FakeConf(values)


def _clear_quarry_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("QUARRY_"):
            monkeypatch.delenv(name)


def test_resolve_prefers_the_explicit_connection():
    connection = Connection("x:1", "y:2")
    assert (
        Connection.resolve(_FakeSpark({"spark.quarry.branchManager": "z:3"}), connection)
        is connection
    )


def test_resolve_reads_the_session_conf_over_the_settings(monkeypatch):
    _clear_quarry_env(monkeypatch)
    monkeypatch.setenv("QUARRY_COMMITTER_ADDRESS", "env-committer:9")
    resolved = Connection.resolve(
        _FakeSpark(
            {"spark.quarry.branchManager": "conf-bm:1", "spark.quarry.s3Region": "ap-south-1"}
        )
    )
    assert resolved == Connection("conf-bm:1", "env-committer:9", "", "ap-south-1")
    assert Connection.resolve() == Connection("127.0.0.1:7402", "env-committer:9")


def test_an_escaped_slash_stays_inside_its_segment():
    uri = parse_uri("quarry://r/main%2Fx/p%2Fq/r")
    assert (uri.ref, uri.path) == ("main/x", "p/q/r")
    assert parse_uri(str(parse_uri("quarry://repo/a%2541/x%20y"))) == parse_uri(
        "quarry://repo/a%2541/x%20y"
    )


def test_a_branch_shaped_like_an_ephemeral_one_with_an_impossible_time_is_not_one():
    assert ephemeral_created_at("_quarry-spark-20241399T000000-0123456789ab") is None


def test_job_ids_are_in_utc_whatever_the_given_zone():
    import datetime as dt

    local = dt.datetime(2026, 11, 26, 3, 0, tzinfo=dt.timezone(dt.timedelta(hours=3)))
    created = ephemeral_created_at(ephemeral_branch(new_job_id(local)))
    assert created == dt.datetime(2026, 11, 26, 0, 0, tzinfo=dt.UTC)


def test_the_entries_schema_names_entry_fields_in_order():
    """An entries DataFrame's columns are quarry.v1.Entry's fields (one source: the proto);
    the DDL Spark reads them with names the same columns in the same order, so a field
    added to Entry fails here until the DDL has it too."""
    from quarry.client.entries import ENTRY_FIELDS
    from quarry.spark.reader import ENTRIES_DDL, ENTRY_COLUMNS

    ddl_columns = tuple(column.split(" ")[0] for column in ENTRIES_DDL.split(", "))
    assert ddl_columns == ENTRY_COLUMNS == ENTRY_FIELDS
