"""The floor of the S3 gateway benchmark: a bare streaming endpoint on the gateway's own HTTP
stack (uvicorn + httptools, an ASGI app on a worker thread pool, the same body bridge: a
small body read on the event loop, an answer's messages sent together; TCP_NODELAY, which
uvicorn.run's own socket has),
with no auth, no metadata and no Quarry calls: PUT streams the body to a file, GET streams
it back. `python benchmarks/s3_bare_endpoint.py PORT DIR [--fsync]`: with --fsync a PUT is
as durable as the gateway's (the file fsynced before it takes its name, then its
directory), the floor's cost of what the gateway must not skip."""

from __future__ import annotations

import hashlib
import os
import sys
import uuid

import uvicorn

from quarry.s3gateway.app import _Bridge


class Bare:
    def __init__(self, root: str, fsync: bool = False) -> None:
        self._root = root
        self._fsync = fsync
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(32)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        import asyncio

        loop = asyncio.get_running_loop()
        bridge = _Bridge(receive, send, loop)
        await bridge.prefetch(scope["headers"])  # as the gateway: a small body read here
        await loop.run_in_executor(self._pool, self._handle, scope, bridge)

    def _handle(self, scope, bridge: _Bridge) -> None:
        name = hashlib.sha256(scope["path"].encode()).hexdigest()
        path = os.path.join(self._root, name)
        if scope["method"] == "PUT":
            md5 = hashlib.md5()
            temp = f"{path}.{uuid.uuid4().hex}"
            with open(temp, "wb") as out:
                while chunk := bridge.read(1 << 20):
                    md5.update(chunk)
                    out.write(chunk)
                if self._fsync:
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(temp, path)
            if self._fsync:
                directory = os.open(self._root, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
            headers = [(b"etag", f'"{md5.hexdigest()}"'.encode()), (b"content-length", b"0")]
            bridge.send(
                {"type": "http.response.start", "status": 200, "headers": headers},
                {"type": "http.response.body", "body": b""},
            )
            return
        size = os.path.getsize(path)
        headers = [(b"content-length", str(size).encode()), (b"etag", b'"x"')]
        # As the gateway: the start with the first piece, the piece completing the length
        # ends the body (one crossing to the event loop for a small object).
        pending = [{"type": "http.response.start", "status": 200, "headers": headers}]
        sent = 0
        with open(path, "rb") as source:
            while chunk := source.read(4 << 20):
                sent += len(chunk)
                pending.append(
                    {"type": "http.response.body", "body": chunk, "more_body": sent < size}
                )
                bridge.send(*pending)
                pending = []
        if sent < size or size == 0:
            bridge.send(*pending, {"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    port, root = int(sys.argv[1]), sys.argv[2]
    print(f"bare endpoint ready on 127.0.0.1:{port}", flush=True)
    uvicorn.run(
        Bare(root, fsync="--fsync" in sys.argv[3:]),
        host="127.0.0.1",
        port=port,
        http="httptools",
        log_level="warning",
        lifespan="off",
    )
