"""The whole suite with a repository whose storage namespace is S3 (a real moto_server on
loopback): ranges and metaranges land in the bucket and every flow works on them."""

import boto3
import pytest
from botocore.config import Config

from quarry.v1 import types_pb2
from support.suite import running_suite


def test_versioning_flows_on_an_s3_namespace(tmp_path, moto_endpoint, s3_bucket):
    with running_suite(tmp_path, s3_endpoint_url=moto_endpoint) as suite, suite.client() as client:
        namespace = f"s3://{s3_bucket}/lake/demo"
        client.create_repository("s3-demo", namespace)
        client.put_objects(
            "s3-demo",
            "main",
            [
                types_pb2.Entry(
                    path=f"data/{i:04d}.parquet",
                    physical_address=f"{namespace}/d/{i}",
                    size_bytes=i,
                    checksum=f"c{i}",
                )
                for i in range(2000)
            ],
        )
        first = client.commit("s3-demo", "main", "load")
        assert first.summary.added == 2000 and first.ranges_written >= 1
        client.create_branch("s3-demo", "feature", "main")
        client.put_object(
            "s3-demo",
            "feature",
            path="data/0007.parquet",
            physical_address=f"{namespace}/d/7b",
            size_bytes=7,
            checksum="new",
        )
        client.commit("s3-demo", "feature", "change one")
        client.delete_objects("s3-demo", "main", ["data/0001.parquet"])
        client.commit("s3-demo", "main", "delete one")
        merged = client.merge("s3-demo", "feature", "main")
        assert merged.summary.changed == 1
        assert client.stat_object("s3-demo", "main@", "data/0007.parquet").checksum == "new"
        listed = list(client.iter_objects("s3-demo", "main", prefix="data/"))
        assert len(listed) == 1999
        diff = list(client.iter_diff("s3-demo", "main~1", "main"))
        assert [(c.path, c.type) for c in diff] == [
            ("data/0007.parquet", types_pb2.CHANGE_TYPE_CHANGED)
        ]

    s3 = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    keys = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="lake/demo/").get("Contents", [])
    ]
    assert any(k.startswith("lake/demo/_quarry/ranges/") for k in keys)
    assert any(k.startswith("lake/demo/_quarry/metaranges/") for k in keys)


def test_a_dump_restores_into_another_installation_over_an_s3_namespace(
    tmp_path, moto_endpoint, s3_bucket
):
    """quarry.graveler.dumps on S3: the namespace's marker and metaranges are read from the
    bucket, and the adopting installation's marker replaces the old one there."""
    import json

    from quarry import errors

    namespace = f"s3://{s3_bucket}/lake/dumped"
    with (
        running_suite(tmp_path / "one", s3_endpoint_url=moto_endpoint) as suite,
        suite.client() as client,
    ):
        client.create_repository("moved", namespace)
        client.put_objects(
            "moved",
            "main",
            [
                types_pb2.Entry(
                    path="a", physical_address=f"{namespace}/d/a", size_bytes=1, checksum="ca"
                )
            ],
        )
        head = client.commit("moved", "main", "a").commit.id
        records = list(client.dump_repository("moved"))
    with (
        running_suite(tmp_path / "two", s3_endpoint_url=moto_endpoint) as suite,
        suite.client() as client,
    ):
        with pytest.raises(errors.QuarryError) as refused:
            client.restore_repository("moved", namespace, records)
        assert refused.value.reason == "NAMESPACE_OF_ANOTHER_INSTALLATION"
        client.restore_repository("moved", namespace, records, adopt_namespace=True)
        assert client.get_branch("moved", "main").commit_id == head
        assert client.stat_object("moved", "main", "a").checksum == "ca"
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    marker = json.loads(
        s3.get_object(Bucket=s3_bucket, Key="lake/dumped/_quarry/repository.json")["Body"].read()
    )
    assert (
        marker["repository"] == "moved"
        and marker["installation_id"] != records[0].header.installation_id
    )
