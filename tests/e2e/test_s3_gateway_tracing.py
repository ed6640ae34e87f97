"""An S3 request carrying a W3C `traceparent` header joins the caller's trace: the gateway's
span and the spans of branch-manager and committer it calls all carry the caller's trace id.
All as users run it: `quarry up --traces` (real processes, the real OTLP exporters, the trace
receiver writing $QUARRY_HOME/traces.jsonl), boto3 as the S3 client."""

from __future__ import annotations

import json

import boto3
from botocore.config import Config

from support.otlp import quarry_up_with_traces
from support.wait import wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def test_a_traceparent_header_makes_the_gateway_and_its_grpc_calls_one_trace(tmp_path):
    with quarry_up_with_traces(tmp_path, QUARRY_LOG_FORMAT="json") as up:
        ports = up.ports

        def quarry(*args: str) -> str:
            return up.quarry(*args).stdout

        quarry("repo", "create", "traced", str(tmp_path / "lake"))
        made = json.loads(quarry("--json", "auth", "credentials", "create", "admin"))
        s3 = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{ports['s3-gateway']}",
            aws_access_key_id=made["access_key_id"],
            aws_secret_access_key=made["secret_access_key"],
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

        def with_traceparent(request, **_) -> None:
            # Added before signing: the header is part of what the client signs.
            request.headers["traceparent"] = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"

        s3.meta.events.register("before-sign.s3.PutObject", with_traceparent)
        s3.put_object(Bucket="traced", Key="main/t/object.txt", Body=b"traced")

        def ours() -> dict | None:
            for trace in up.traces():
                if trace["trace_id"] == TRACE_ID and {
                    "quarry-s3-gateway",
                    "quarry-branch-manager",
                } <= {s["service"] for s in trace["spans"]}:
                    return trace
            return None

        wait_until(lambda: ours() is not None, timeout=30, what="the S3 request's trace")
        spans = ours()["spans"]  # type: ignore[index]
        (gateway_span,) = [s for s in spans if s["parent_id"] == PARENT_SPAN_ID]
        # The request's span, child of the caller's (which is not in the receiver: it is
        # this test's, never exported).
        assert (gateway_span["service"], gateway_span["name"]) == (
            "quarry-s3-gateway",
            "S3 PutObject",
        )
        by_id = {s["span_id"]: s for s in spans}

        def under_gateway(span: dict) -> bool:
            while span["parent_id"] in by_id:
                span = by_id[span["parent_id"]]
                if span is gateway_span:
                    return True
            return False

        staged = [
            s
            for s in spans
            if s["service"] == "quarry-branch-manager"
            and s["name"] == "/quarry.v1.BranchManager/PutObject"
        ]
        assert staged and all(under_gateway(s) for s in staged), spans

        # The gateway's request line is logged inside its span: it carries the trace id, as
        # do the back-end's lines of the same request (an operator follows one into the other).
        def lines(service: str) -> list[dict]:
            return [
                line
                for line in up.json_logs()
                if line.get("service") == service and line.get("trace_id") == TRACE_ID
            ]

        wait_until(lambda: lines("s3-gateway"), timeout=30, what="the gateway's request line")
        (request_line,) = lines("s3-gateway")
        assert request_line["message"].startswith("s3 PutObject PUT /traced/main/t/object.txt")
        assert lines("branch-manager"), "no back-end line with the request's trace id"
