"""Service logging: `text` for people, `json` for log pipelines (QUARRY_LOG_FORMAT).

A JSON line carries the trace_id and span_id of the span current where it was logged, so a
log search for a trace id finds every line of that request in every service (the ids are
the W3C hex forms OTLP backends show)."""

from __future__ import annotations

import datetime
import json
import logging

from opentelemetry import trace


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "service": self._service,
            # Which process: one of a service's worker processes when it runs several.
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid and context.trace_flags.sampled:
            line["trace_id"] = format(context.trace_id, "032x")
            line["span_id"] = format(context.span_id, "016x")
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(service: str, level: str, log_format: str, worker: bool = False) -> None:
    """Root logging of a service process, on stderr. `worker`: one of the service's worker
    processes (quarry.runtime.workers): text lines name its pid (JSON lines always do)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        process = "[%(process)d]" if worker else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s quarry{process} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
