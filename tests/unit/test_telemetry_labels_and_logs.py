"""Label cardinality caps and JSON log lines (quarry.telemetry)."""

from __future__ import annotations

import json
import logging

import pytest

from quarry import errors, telemetry
from quarry.config import load_settings
from quarry.telemetry.logs import JsonFormatter
from quarry.telemetry.metrics import EPHEMERAL_LABEL, OTHER_LABEL, BranchLabels


def test_named_branches_keep_their_names_up_to_the_cap_then_other():
    labels = BranchLabels(limit=3)
    assert labels("lake", "main") == ("lake", "main")
    assert labels("lake", "dev") == ("lake", "dev")
    assert labels("other-lake", "main") == ("other-lake", "main")
    assert labels("lake", "fourth") == (OTHER_LABEL, OTHER_LABEL)
    assert labels("lake", "main") == ("lake", "main")  # seen before the cap: still named


def test_ephemeral_branches_share_one_value_and_take_no_slot():
    labels = BranchLabels(limit=2)
    labels("lake", "main")
    for n in range(1000):
        branch = f"_quarry-spark-20260101T000000-{n:012x}"
        assert labels("lake", branch) == ("lake", EPHEMERAL_LABEL)
    # A repository the process has no named branch of does not become a label value either.
    assert labels("unseen", "_quarry-spark-x") == (OTHER_LABEL, EPHEMERAL_LABEL)
    assert labels("lake", "dev") == ("lake", "dev")  # the second slot was still free
    assert len(labels._known) == 2


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("quarry.test", logging.INFO, __file__, 1, message, (), None)


def test_json_lines_carry_the_current_trace_and_span_ids():
    telemetry.use_in_memory_exporter()
    formatter = JsonFormatter("committer")
    outside = json.loads(formatter.format(_record("idle")))
    assert outside["message"] == "idle" and outside["service"] == "committer"
    assert "trace_id" not in outside and "span_id" not in outside
    with telemetry.tracer("test").start_as_current_span("request") as span:
        inside = json.loads(formatter.format(_record("serving")))
    context = span.get_span_context()
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert inside["level"] == "INFO" and inside["logger"] == "quarry.test"
    with telemetry.background():  # unsampled: no trace anyone could look up
        assert "trace_id" not in json.loads(formatter.format(_record("loop")))


def test_log_format_is_checked():
    assert load_settings(env={"QUARRY_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(errors.InvalidArgument, match="log_format"):
        load_settings(env={"QUARRY_LOG_FORMAT": "xml"})
