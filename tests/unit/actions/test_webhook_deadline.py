"""A webhook's timeout bounds the whole call, over a real loopback socket: a receiver that
answers a byte at a time (headers or body) cannot hold the hook, and the caller's thread,
past it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from quarry.actions import webhook


def _dripping_receiver(headers_first: bool) -> tuple[int, threading.Event]:
    """A loopback server that answers one request one byte every 50 ms for 20 s: the
    headers at once and then the body (headers_first), or the headers themselves."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n"
            if headers_first:
                connection.sendall(head)
            drip = (b"" if headers_first else head) + b"x" * 400
            deadline = time.monotonic() + 20
            for byte in drip:
                if done.is_set() or time.monotonic() > deadline:
                    return
                try:
                    connection.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.05)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], done


@pytest.mark.parametrize("headers_first", [True, False])
def test_a_dripping_receiver_is_cut_at_the_timeout(headers_first):
    port, done = _dripping_receiver(headers_first)
    started = time.monotonic()
    try:
        answer = webhook.post(
            f"http://127.0.0.1:{port}/", {"event": "x"}, {}, 1.0, b"secret", ("loopback",)
        )
    finally:
        done.set()
    elapsed = time.monotonic() - started
    assert answer.status == 0 and answer.error == "timed out after 1s"
    # A hang bound, not a speed floor: uncut, the drip lasts 20 s.
    assert elapsed < 10, elapsed
