"""A console page request is one trace with the gRPC calls it makes: the console's span and
the branch-manager spans under it share a trace id; a W3C `traceparent` header from the
browser's side joins the caller's trace, as at the s3-gateway. All as users run it: `quarry
up --traces` (real processes, the real OTLP exporters, the trace receiver writing
$QUARRY_HOME/traces.jsonl), the console driven over HTTP."""

from __future__ import annotations

from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY
from support.console import Browser
from support.otlp import quarry_up_with_traces
from support.wait import wait_until

TRACE_ID = "5ac92f3577b34da6a3ce929d0e0e4737"
PARENT_SPAN_ID = "10f067aa0ba902b8"


def _under(span: dict, ancestor: dict, by_id: dict[str, dict]) -> bool:
    while span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        if span is ancestor:
            return True
    return False


def _page_trace(up, page: str, trace_id: str = "") -> dict | None:
    """The trace holding the console span `page` and branch-manager spans, if received."""
    for trace in up.traces():
        if trace_id and trace["trace_id"] != trace_id:
            continue
        names = {(s["service"], s["name"]) for s in trace["spans"]}
        services = {service for service, _ in names}
        if ("quarry-console", page) in names and "quarry-branch-manager" in services:
            return trace
    return None


def test_a_console_page_and_its_grpc_calls_are_one_trace_joining_a_callers_traceparent(
    tmp_path,
):
    with quarry_up_with_traces(tmp_path, QUARRY_LOG_FORMAT="json") as up:
        up.quarry("repo", "create", "traced", str(tmp_path / "lake"))
        browser = Browser(up.ports["console"])
        assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303

        # No traceparent: the page's span is the root of its own trace, the gRPC calls in it.
        assert browser.get("/repos/traced/branches").status == 200
        wait_until(
            lambda: _page_trace(up, "console branches") is not None,
            timeout=30,
            what="the branches page's trace",
        )
        trace = _page_trace(up, "console branches")
        assert trace is not None
        spans = trace["spans"]
        by_id = {s["span_id"]: s for s in spans}
        (page,) = [s for s in spans if s["name"] == "console branches"]
        assert page["service"] == "quarry-console" and not page["parent_id"]
        listed = [s for s in spans if s["name"] == "/quarry.v1.BranchManager/ListBranches"]
        assert listed and all(_under(s, page, by_id) for s in listed), spans

        # With a traceparent: the page's span is a child of the caller's, in its trace.
        browser.headers["traceparent"] = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
        assert browser.get("/repos/traced/objects?ref=main").status == 200
        wait_until(
            lambda: _page_trace(up, "console objects", TRACE_ID) is not None,
            timeout=30,
            what="the object browser's trace under the caller's trace id",
        )
        joined = _page_trace(up, "console objects", TRACE_ID)
        assert joined is not None
        spans = joined["spans"]
        by_id = {s["span_id"]: s for s in spans}
        (page,) = [s for s in spans if s["parent_id"] == PARENT_SPAN_ID]
        assert (page["service"], page["name"]) == ("quarry-console", "console objects")
        listed = [s for s in spans if s["name"] == "/quarry.v1.BranchManager/ListObjects"]
        assert listed and all(_under(s, page, by_id) for s in listed), spans

        # The page's request line is logged inside its span: it carries the trace id.
        def request_lines() -> list[dict]:
            return [
                line
                for line in up.json_logs()
                if line.get("service") == "console" and line.get("trace_id") == TRACE_ID
            ]

        wait_until(request_lines, timeout=30, what="the console's request line")
        assert request_lines()[-1]["message"].startswith(
            "console objects GET /repos/traced/objects"
        )
