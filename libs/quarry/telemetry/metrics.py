"""Prometheus: one HTTP endpoint per service process."""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


def start_metrics_endpoint(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Serve /metrics on host:port; port 0 disables it. Returns the bound port (0 if none)."""
    if port <= 0:
        return 0
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound
