"""grpcurl against a real `quarry serve kv-gateway` process (reflection, JSON bytes as
base64, error statuses as a grpcurl user sees them)."""

import base64
import json
import subprocess

import pytest

from support.auth import admin_token_source, service_token
from support.grpcurl import GRPCURL, grpcurl, proto_args
from support.processes import free_port, quarry_env, quarry_serve, wait_serving


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    if not GRPCURL.exists():
        pytest.fail(f"grpcurl not found at {GRPCURL}: run `make install`")
    port = free_port()
    env = quarry_env(
        tmp_path_factory.mktemp("home"), QUARRY_KV_URL="memory://", QUARRY_KV_GATEWAY_PORT=str(port)
    )
    with quarry_serve("kv-gateway", env) as child:
        target = f"127.0.0.1:{port}"
        wait_serving(target)
        yield target
        assert child.poll() is None, child.stderr.read()


def kv_grpcurl(*args: str, data: dict | None = None) -> subprocess.CompletedProcess:
    """grpcurl with a service token: the kv-gateway's writes are for Quarry's services only
    (an operator mints one with `quarry auth token --service NAME`)."""
    return grpcurl(*args, data=data, token=service_token("operator"))


def admin_grpcurl(*args: str, data: dict | None = None) -> subprocess.CompletedProcess:
    """grpcurl with the test admin's token (`quarry auth token`)."""
    return grpcurl(*args, data=data, token=admin_token_source()())


def test_list_by_reflection_shows_the_gateway_services(gateway):
    result = grpcurl(gateway, "list")
    assert result.returncode == 0, result.stderr
    listed = set(result.stdout.split())
    assert {
        "quarry.v1.KVGateway",
        "quarry.v1.ServerInfo",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= listed


def test_list_from_the_proto_files_shows_the_whole_contract():
    result = subprocess.run(
        [str(GRPCURL), *proto_args(), "list"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {
        "quarry.v1.KVGateway",
        "quarry.v1.BranchManager",
        "quarry.v1.Committer",
        "quarry.v1.CompactorSensor",
        "quarry.v1.RangeWriter",
        "quarry.v1.ServerInfo",
        "quarry.v1.Auth",
    }


def test_describe_and_server_info(gateway):
    result = grpcurl(gateway, "describe", "quarry.v1.KVGateway")
    assert result.returncode == 0, result.stderr
    assert "rpc SetItemIf" in result.stdout and "rpc ScanItems" in result.stdout
    info = grpcurl(gateway, "quarry.v1.ServerInfo/GetServerInfo")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["service"] == "kv-gateway"
    health = grpcurl(gateway, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout)["status"] == "SERVING"


def test_set_get_set_if_round_trip(gateway):
    item = {"partitionKey": b64(b"repo/demo/1"), "key": b64(b"branches/main")}
    result = kv_grpcurl(gateway, "quarry.v1.KVGateway/SetItem", data={**item, "value": b64(b"v1")})
    assert result.returncode == 0, result.stderr

    got = kv_grpcurl(gateway, "quarry.v1.KVGateway/GetItem", data=item)
    assert got.returncode == 0, got.stderr
    reply = json.loads(got.stdout)
    assert base64.b64decode(reply["value"]) == b"v1"

    swapped = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/SetItemIf",
        data={**item, "value": b64(b"v2"), "ifEquals": reply["predicate"]},
    )
    assert swapped.returncode == 0, swapped.stderr
    got = json.loads(kv_grpcurl(gateway, "quarry.v1.KVGateway/GetItem", data=item).stdout)
    assert base64.b64decode(got["value"]) == b"v2"

    # The old predicate is stale now: ABORTED with reason PREDICATE_FAILED.
    stale = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/SetItemIf",
        data={**item, "value": b64(b"v3"), "ifEquals": reply["predicate"]},
    )
    assert stale.returncode != 0
    error = json.loads(stale.stdout or stale.stderr)
    assert error["code"] == 10  # ABORTED
    assert "PREDICATE_FAILED" in json.dumps(error)
    assert "quarry.dev" in json.dumps(error)

    absent = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/SetItemIf",
        data={**item, "value": b64(b"v3"), "ifAbsent": True},
    )
    assert json.loads(absent.stdout or absent.stderr)["code"] == 10


def test_invalid_argument_cases(gateway):
    unknown = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/SetItem",
        data={"partitionKey": b64(b"elsewhere"), "key": b64(b"k"), "value": b64(b"v")},
    )
    error = json.loads(unknown.stdout or unknown.stderr)
    assert error["code"] == 3  # INVALID_ARGUMENT
    assert "UNKNOWN_PARTITION_CLASS" in json.dumps(error)

    too_large = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/SetItem",
        data={"partitionKey": b64(b"cleanup"), "key": b64(b"k" * 1025), "value": b64(b"v")},
    )
    error = json.loads(too_large.stdout or too_large.stderr)
    assert error["code"] == 3
    assert "KEY_TOO_LARGE" in json.dumps(error)

    missing = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/GetItem",
        data={"partitionKey": b64(b"cleanup"), "key": b64(b"absent")},
    )
    error = json.loads(missing.stdout or missing.stderr)
    assert error["code"] == 5  # NOT_FOUND
    assert "KEY_NOT_FOUND" in json.dumps(error)


def test_versioning_workflow_with_grpcurl(tmp_path):
    """The README's branch-manager / committer examples, as a grpcurl user runs them."""
    from support.suite import running_suite

    with running_suite(tmp_path) as suite:
        bm = suite.targets["branch-manager"]
        cm = suite.targets["committer"]
        listed = grpcurl(bm, "list")
        assert "quarry.v1.BranchManager" in listed.stdout, listed.stderr
        created = admin_grpcurl(
            bm,
            "quarry.v1.BranchManager/CreateRepository",
            data={"name": "demo", "storage_namespace": suite.namespace("demo")},
        )
        assert created.returncode == 0, created.stderr
        put = admin_grpcurl(
            bm,
            "quarry.v1.BranchManager/PutObject",
            data={
                "repository": "demo",
                "branch": "main",
                "entry": {
                    "path": "a/b.parquet",
                    "physical_address": "s3://bucket/x",
                    "size_bytes": "42",
                    "checksum": "abc",
                },
            },
        )
        assert put.returncode == 0, put.stderr
        commit = admin_grpcurl(
            cm,
            "quarry.v1.Committer/Commit",
            data={"repository": "demo", "branch": "main", "message": "first"},
        )
        assert json.loads(commit.stdout)["summary"]["added"] == "1"
        listing = json.loads(
            admin_grpcurl(
                bm,
                "quarry.v1.BranchManager/ListObjects",
                data={"repository": "demo", "ref": "main", "delimiter": "/"},
            ).stdout
        )
        assert listing.get("commonPrefixes", listing.get("common_prefixes")) == ["a/"], listing
        log = json.loads(
            admin_grpcurl(
                cm, "quarry.v1.Committer/Log", data={"repository": "demo", "ref": "main"}
            ).stdout
        )
        assert [c["message"] for c in log["commits"]] == ["first", "Repository created"]
        # The log's filters as grpcurl sends them (JSON names, a Timestamp as RFC 3339).
        for filters, expected in (
            ({"prefixes": ["a/"]}, ["first"]),
            ({"objects": ["a/b"]}, []),
            ({"since": "2999-01-01T00:00:00Z"}, []),
        ):
            filtered = admin_grpcurl(
                cm,
                "quarry.v1.Committer/Log",
                data={"repository": "demo", "ref": "main", **filters},
            )
            assert filtered.returncode == 0, filtered.stderr
            commits = json.loads(filtered.stdout).get("commits", [])
            assert [c["message"] for c in commits] == expected, filters
        missing = admin_grpcurl(
            bm,
            "quarry.v1.BranchManager/StatObject",
            data={"repository": "demo", "ref": "main", "path": "nope"},
        )
        error = json.loads(missing.stdout or missing.stderr)
        assert error["code"] == 5 and "OBJECT_NOT_FOUND" in json.dumps(error)

        # A dump streams out as JSON messages, and streams back in as a restore (a client
        # stream: the messages on stdin) after the repository was deleted.
        dumped = admin_grpcurl(bm, "quarry.v1.BranchManager/DumpRepository", data={"name": "demo"})
        assert dumped.returncode == 0, dumped.stderr
        records = [r for message in json_stream(dumped.stdout) for r in message["records"]]
        assert records[0]["header"]["repository"]["name"] == "demo"
        assert records[-1]["end"]["commits"] == "2"
        deleted = admin_grpcurl(
            bm, "quarry.v1.BranchManager/DeleteRepository", data={"name": "demo"}
        )
        assert deleted.returncode == 0, deleted.stderr
        first = {"name": "again", "storage_namespace": suite.namespace("demo")}
        messages = [{**first, "records": records[:2]}, {"records": records[2:]}]
        restored = grpcurl(
            bm,
            "quarry.v1.BranchManager/RestoreRepository",
            messages=messages,
            token=admin_token_source()(),
        )
        assert restored.returncode == 0, restored.stderr
        assert json.loads(restored.stdout)["repository"]["name"] == "again"
        log = admin_grpcurl(
            cm, "quarry.v1.Committer/Log", data={"repository": "again", "ref": "main"}
        )
        assert [c["message"] for c in json.loads(log.stdout)["commits"]] == [
            "first",
            "Repository created",
        ]


def json_stream(text: str) -> list[dict]:
    """The JSON messages grpcurl prints one after another for a server stream."""
    decoder, at, out = json.JSONDecoder(), 0, []
    while text[at:].strip():
        message, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        out.append(message)
        at = end
    return out


def test_without_a_token_grpcurl_gets_unauthenticated_with_the_reason(gateway):
    result = grpcurl(
        gateway,
        "quarry.v1.KVGateway/GetItem",
        data={"partition_key": b64(b"quarry"), "key": b64(b"format-version")},
    )
    error = json.loads(result.stdout or result.stderr)
    assert error["code"] == 16 and "TOKEN_MISSING" in json.dumps(error), error
    with_token = kv_grpcurl(
        gateway,
        "quarry.v1.KVGateway/GetItem",
        data={"partition_key": b64(b"quarry"), "key": b64(b"format-version")},
    )
    assert with_token.returncode == 0, with_token.stdout + with_token.stderr
