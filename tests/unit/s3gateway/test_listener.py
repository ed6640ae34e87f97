"""The gateway's (and the console's) listening socket gives every accepted connection
TCP_NODELAY: uvicorn serves a socket made with protocol 0, on which asyncio does not set
it, and a small answer would otherwise wait on Nagle's algorithm for the client's delayed
ACK."""

from __future__ import annotations

import socket

from quarry.runtime.asgi_server import http_listener


def test_accepted_connections_have_tcp_nodelay():
    listener = http_listener("s3-gateway", "127.0.0.1", 0)
    try:
        listener.listen()
        with socket.create_connection(listener.getsockname()) as _client:
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()
