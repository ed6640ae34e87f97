"""Multi-process serving of the S3 gateway (issue 29, item 3: "any other service where it
pays"): a real `quarry serve s3-gateway` with QUARRY_S3_GATEWAY_WORKERS=2 in front of the
suite, driven by SigV4-signed HTTP requests on connections of the test's choosing.

Its connections land on every worker; what one worker writes another serves at once; a
multipart upload whose calls go to different workers completes (its state is in the
repository's namespace, never in a worker); its one metrics port reports the workers' sum;
stopping it — SIGTERM, or SIGKILL, when none of its code runs — leaves no worker, and
SIGTERM drains each; one worker dying stops the service."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from support.processes import (
    check_supervisor_stop,
    children_of,
    connection_per_worker,
    json_lines,
    outlived,
)
from support.s3gateway import Gateway, running_gateway
from support.wait import wait_until

WORKERS = 2
REPO = "lake"


@contextlib.contextmanager
def gateway_with_workers(home: Path) -> Iterator[Gateway]:
    with running_gateway(home, gateway_env={"QUARRY_S3_GATEWAY_WORKERS": str(WORKERS)}) as gw:
        # Answering means one worker answers: wait for every worker too.
        wait_until(
            lambda: len(children_of(gw.process.pid)) >= WORKERS,
            timeout=60,
            interval=0.1,
            what="every s3-gateway worker",
        )
        with gw.suite.client() as client:
            client.create_repository(REPO, gw.suite.namespace(REPO))
        yield gw


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory) -> Iterator[Gateway]:
    """One gateway for the tests that only call it: a start costs a suite, a supervisor and
    WORKERS processes."""
    with gateway_with_workers(tmp_path_factory.mktemp("s3-workers")) as gw:
        yield gw


@pytest.fixture
def own_gateway(tmp_path) -> Iterator[Gateway]:
    """A gateway of the test's own, for a test that stops or kills it."""
    with gateway_with_workers(tmp_path) as gw:
        yield gw


def _hex_address(address: str) -> str:
    """/proc/net/tcp's form of 127.0.0.1:PORT."""
    host, port = address.rsplit(":", 1)
    return f"{int.from_bytes(bytes(map(int, host.split('.'))), 'little'):08X}:{int(port):04X}"


def serving_pid(conn: http.client.HTTPConnection, pids: list[int]) -> int:
    """The worker holding the server's end of `conn` (an established, accepted connection):
    the socket inode /proc/net/tcp lists for (gateway port, our port), found among the
    workers' file descriptors."""
    ours = "{}:{}".format(*conn.sock.getsockname())
    theirs = "{}:{}".format(*conn.sock.getpeername())
    inode = ""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == _hex_address(theirs) and fields[2] == _hex_address(ours):
            inode = fields[9]
    assert inode, f"no server socket for {ours} -> {theirs}"
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
    raise AssertionError(f"the connection {ours} is held by none of the workers {pids}")


class Signer:
    """SigV4-signed requests (botocore's signer) on connections this test holds."""

    def __init__(self, gw: Gateway) -> None:
        self.key, self.secret = gw.credentials()
        self.host = gw.endpoint.removeprefix("http://")

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, timeout=30)

    def call(
        self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        request = AWSRequest(
            method=method,
            url=f"http://{self.host}{path}",
            data=body,
            headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()},
        )
        S3SigV4Auth(Credentials(self.key, self.secret), "s3", "us-east-1").add_auth(request)
        # The path as signed (botocore encodes the query as it signs it).
        signed = urllib.parse.urlsplit(request.prepare().url)
        target = f"{signed.path}?{signed.query}" if signed.query else signed.path
        conn.request(method, target, body=body, headers=dict(request.headers.items()))
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def connection_to_each_worker(
    signer: Signer, workers: list[int]
) -> contextlib.AbstractContextManager[dict[int, http.client.HTTPConnection]]:
    """{worker pid: a kept-alive connection to that worker}."""

    def served_by(conn: http.client.HTTPConnection) -> int:
        status, _, _ = signer.call(conn, "HEAD", f"/{REPO}")
        assert status == 200
        return serving_pid(conn, workers)

    return connection_per_worker(workers, signer.connection, served_by)


def workers_of(gw: Gateway) -> list[int]:
    workers = sorted(children_of(gw.process.pid))
    assert len(workers) == WORKERS, workers
    return workers


def test_what_one_worker_writes_another_serves_at_once(shared_gateway):
    signer = Signer(shared_gateway)
    with connection_to_each_worker(signer, workers_of(shared_gateway)) as conns:
        writer, reader = conns.values()
        body = os.urandom(10_000)
        status, headers, _ = signer.call(writer, "PUT", f"/{REPO}/main/across/one.bin", body)
        assert status == 200
        assert headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'
        status, _, got = signer.call(reader, "GET", f"/{REPO}/main/across/one.bin")
        assert (status, got) == (200, body)
        status, _, listing = signer.call(
            reader, "GET", f"/{REPO}?list-type=2&prefix=main%2Facross%2F"
        )
        assert status == 200 and b"<Key>main/across/one.bin</Key>" in listing
        status, _, _ = signer.call(reader, "DELETE", f"/{REPO}/main/across/one.bin")
        assert status == 204
        status, _, _ = signer.call(writer, "HEAD", f"/{REPO}/main/across/one.bin")
        assert status == 404


def test_a_multipart_upload_spread_over_the_workers_completes(shared_gateway):
    signer = Signer(shared_gateway)
    key = f"/{REPO}/main/across/big.bin"
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
    with connection_to_each_worker(signer, workers_of(shared_gateway)) as conns:
        first, second = conns.values()
        status, _, created = signer.call(first, "POST", f"{key}?uploads")
        assert status == 200, created
        upload = re.search(rb"<UploadId>([^<]+)</UploadId>", created)[1].decode()
        etags = []
        # Part 1 through the other worker, part 2 through the first: neither holds the upload.
        for number, (conn, part) in enumerate(zip((second, first), parts, strict=True), 1):
            status, headers, _ = signer.call(
                conn, "PUT", f"{key}?partNumber={number}&uploadId={upload}", part
            )
            assert status == 200
            etags.append(headers["etag"])
        status, _, listed = signer.call(first, "GET", f"{key}?uploadId={upload}")
        assert status == 200 and listed.count(b"<Part>") == 2
        complete = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
            for n, etag in enumerate(etags, 1)
        )
        status, _, done = signer.call(
            second,
            "POST",
            f"{key}?uploadId={upload}",
            f"<CompleteMultipartUpload>{complete}</CompleteMultipartUpload>".encode(),
        )
        assert status == 200 and b"<CompleteMultipartUploadResult" in done, done
        status, _, got = signer.call(first, "GET", key)
        assert status == 200 and got == b"".join(parts)


def s3_requests(text: str, operation: str) -> float:
    found = re.findall(
        rf'^quarry_s3_requests_total\{{[^}}]*operation="{operation}"[^}}]*\}} (\S+)$', text, re.M
    )
    return sum(float(value) for value in found)


def test_the_metrics_port_reports_the_sum_of_the_workers(shared_gateway):
    signer = Signer(shared_gateway)

    def scrape() -> str:
        with urllib.request.urlopen(shared_gateway.metrics + "/metrics", timeout=10) as reply:
            return reply.read().decode()

    workers = workers_of(shared_gateway)
    calls = {pid: 3 + i for i, pid in enumerate(workers)}
    with connection_to_each_worker(signer, workers) as conns:
        # (Finding the connections made calls too: counted from here on.)
        before = s3_requests(scrape(), "HeadBucket")
        for pid, conn in conns.items():
            for _ in range(calls[pid]):
                assert signer.call(conn, "HEAD", f"/{REPO}")[0] == 200
                assert serving_pid(conn, workers) == pid
    text = scrape()
    assert s3_requests(text, "HeadBucket") - before == sum(calls.values())
    assert re.search(r'^quarry_workers\{service="s3-gateway"\} 2\.0$', text, re.M), text
    assert text.count("# TYPE quarry_s3_requests_total counter") == 1


def test_only_the_first_worker_sweeps_abandoned_uploads(shared_gateway):
    """One sweep per gateway, not one per worker: the worker its supervisor numbered 0."""
    workers = workers_of(shared_gateway)
    first = [
        pid
        for pid in workers
        if f"QUARRY_SERVING_WORKER=0:{WORKERS}:"
        in Path(f"/proc/{pid}/environ").read_text(errors="replace")
    ]
    assert len(first) == 1, workers
    sweeping = [
        line["pid"]
        for line in json_lines(shared_gateway.log)
        if line["message"].startswith("sweeping abandoned multipart uploads")
    ]
    assert sweeping == first


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_supervisor_leaves_no_worker(own_gateway, stop):
    port = int(own_gateway.endpoint.rsplit(":", 1)[1])
    check_supervisor_stop(
        own_gateway.process,
        workers_of(own_gateway),
        port,
        stop,
        "s3-gateway",
        own_gateway.log.read_text,
    )


def test_a_worker_that_dies_stops_the_service(own_gateway):
    """Never a gateway quietly running at part of its capacity: whatever supervises it
    (quarry up, Kubernetes) sees it end and restarts it."""
    dying, *others = workers_of(own_gateway)
    os.kill(dying, signal.SIGKILL)
    assert own_gateway.process.wait(30) != 0
    left = outlived(others)
    assert left == []
