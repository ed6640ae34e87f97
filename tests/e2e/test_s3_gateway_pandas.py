"""pandas through s3fs against a real `quarry serve s3-gateway`: a Parquet file and a
partitioned Parquet dataset written on a branch with `df.to_parquet("s3://REPO/BRANCH/...")`,
read back, committed with the `quarry commit` CLI, read back from a tag, and a write to the
tag refused.

s3fs needs aiobotocore, which pins an older botocore than .venv's boto3 needs, so s3fs lives
in .tools/s3fs (`make test-clients` installs it; see the Makefile) and pandas runs in a child
process of .venv's python with that folder first on PYTHONPATH: pandas and pyarrow come from
.venv, s3fs, aiobotocore and botocore from .tools/s3fs, and this process never imports them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from support.processes import REPO_ROOT
from support.s3gateway import running_gateway

S3FS_DIR = REPO_ROOT / ".tools" / "s3fs"
REPO = "frames"

# The child's program: argv[1] is a JSON request {"op": ..., "url": ...}; it prints one JSON
# line. Frames are exchanged as records sorted by id, the partition column as text (pandas
# reads a partition column back as a category).
CHILD = r"""
import json, os, sys
import botocore, pandas as pd, s3fs

request = json.loads(sys.argv[1])
options = {
    "key": os.environ["QUARRY_TEST_KEY"],
    "secret": os.environ["QUARRY_TEST_SECRET"],
    "client_kwargs": {"endpoint_url": os.environ["QUARRY_TEST_ENDPOINT"], "region_name": "us-east-1"},
    # One attempt: a refused write is the answer, not something to retry.
    "config_kwargs": {"retries": {"max_attempts": 1}},
}
frame = pd.DataFrame(request.get("rows", []))
op = request["op"]
if op == "versions":
    print(json.dumps({"s3fs": s3fs.__version__, "botocore": botocore.__version__,
                      "botocore_file": botocore.__file__, "pandas_file": pd.__file__}))
elif op == "write":
    frame.to_parquet(request["url"], storage_options=options, index=False,
                     partition_cols=request.get("partition_cols"))
    print(json.dumps({"ok": True}))
elif op == "read":
    back = pd.read_parquet(request["url"], storage_options=options)
    if "day" in back.columns:
        back["day"] = back["day"].astype(str)
    back = back[sorted(back.columns)].sort_values("id")
    print(json.dumps({"rows": json.loads(back.to_json(orient="records"))}))
elif op == "write-refused":
    try:
        frame.to_parquet(request["url"], storage_options=options, index=False)
    except Exception as error:
        # s3fs raises an OSError (EPERM for MethodNotAllowed) caused by botocore's ClientError,
        # which holds the S3 error code.
        cause = getattr(error.__cause__, "response", {}).get("Error", {})
        print(json.dumps({"refused": type(error).__name__, "message": str(error),
                          "code": cause.get("Code")}))
    else:
        print(json.dumps({"refused": None}))
"""


def pandas_s3(gateway, keys: tuple[str, str], **request) -> dict:
    """Run CHILD with .tools/s3fs first on its path (so its botocore is s3fs's)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(S3FS_DIR), os.environ.get("PYTHONPATH")])),
        "QUARRY_TEST_ENDPOINT": gateway.endpoint,
        "QUARRY_TEST_KEY": keys[0],
        "QUARRY_TEST_SECRET": keys[1],
        # Nothing from the user's own AWS set-up.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(request)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"pandas child {request['op']}: {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    if not (S3FS_DIR / "s3fs").is_dir():
        pytest.fail(f"{S3FS_DIR} holds no s3fs: run `make test-clients`")
    with running_gateway(tmp_path_factory.mktemp("s3fs")) as gw:
        with gw.suite.client() as client:
            client.create_repository(REPO, gw.suite.namespace(REPO))
            client.create_branch(REPO, "etl", "main")
        yield gw


@pytest.fixture(scope="module")
def keys(gateway):
    """The test admin's Quarry credentials, as AWS keys."""
    return gateway.credentials()


def test_the_child_uses_s3fs_botocore_and_the_venv_pandas(gateway, keys):
    """The isolation this test rests on: the child's botocore is .tools/s3fs's (older than
    .venv's), its pandas .venv's."""
    import botocore

    seen = pandas_s3(gateway, keys, op="versions")
    assert seen["botocore_file"].startswith(str(S3FS_DIR))
    assert seen["botocore"] != botocore.__version__
    assert not seen["pandas_file"].startswith(str(S3FS_DIR))


def test_pandas_writes_parquet_on_a_branch_and_reads_it_back_from_a_tag(gateway, keys):
    rows = [{"day": f"2026-11-0{1 + i % 3}", "id": i, "name": f"n{i}"} for i in range(300)]
    single, dataset = f"s3://{REPO}/etl/people/part.parquet", f"s3://{REPO}/etl/events/"

    pandas_s3(gateway, keys, op="write", url=single, rows=rows)
    pandas_s3(gateway, keys, op="write", url=dataset, rows=rows, partition_cols=["day"])
    assert pandas_s3(gateway, keys, op="read", url=f"s3://{REPO}/etl/people/")["rows"] == rows
    assert pandas_s3(gateway, keys, op="read", url=dataset)["rows"] == rows

    # Quarry's own CLI sees what pandas wrote: one file, and one file per partition.
    listed = gateway.quarry("ls", "--recursive", REPO, "etl")
    assert "people/part.parquet" in listed, listed
    for day in ("2026-11-01", "2026-11-02", "2026-11-03"):
        assert re.search(rf"events/day={day}/\S+\.parquet", listed), listed

    gateway.quarry("commit", REPO, "etl", "-m", "frames via pandas and s3fs")
    gateway.quarry("tag", "create", REPO, "frames-v1", "etl")

    tagged = f"s3://{REPO}/frames-v1/"
    assert pandas_s3(gateway, keys, op="read", url=tagged + "people/")["rows"] == rows
    assert pandas_s3(gateway, keys, op="read", url=tagged + "events/")["rows"] == rows

    # A tag is read-only: the gateway answers MethodNotAllowed, s3fs raises it, nothing lands.
    refused = pandas_s3(
        gateway, keys, op="write-refused", url=tagged + "people/more.parquet", rows=rows[:3]
    )
    assert refused["refused"] is not None, "a write to a tag went through"
    assert refused["refused"] == "PermissionError", refused
    assert refused["code"] == "MethodNotAllowed", refused
    assert "not a branch" in refused["message"], refused
    with gateway.suite.client() as client:
        assert not any(e.path == "people/more.parquet" for e in client.iter_objects(REPO, "etl"))
        assert not any(
            e.path == "people/more.parquet" for e in client.iter_objects(REPO, "frames-v1")
        )
