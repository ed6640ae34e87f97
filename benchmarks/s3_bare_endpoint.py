"""The floor of the S3 gateway benchmark: a bare streaming endpoint on the gateway's own HTTP
stack (uvicorn + httptools, an ASGI app on a worker thread pool, the same body bridge),
with no auth, no metadata and no Quarry calls: PUT streams the body to a file, GET streams
it back. `python benchmarks/s3_bare_endpoint.py PORT DIR`."""

from __future__ import annotations

import hashlib
import os
import sys
import uuid

import uvicorn

from quarry.s3gateway.app import _Bridge


class Bare:
    def __init__(self, root: str) -> None:
        self._root = root
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(32)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        import asyncio

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._handle, scope, _Bridge(receive, send, loop))

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
            os.replace(temp, path)
            headers = [(b"etag", f'"{md5.hexdigest()}"'.encode()), (b"content-length", b"0")]
            bridge.send({"type": "http.response.start", "status": 200, "headers": headers})
            bridge.send({"type": "http.response.body", "body": b""})
            return
        size = os.path.getsize(path)
        headers = [(b"content-length", str(size).encode()), (b"etag", b'"x"')]
        bridge.send({"type": "http.response.start", "status": 200, "headers": headers})
        with open(path, "rb") as source:
            while chunk := source.read(1 << 20):
                bridge.send({"type": "http.response.body", "body": chunk, "more_body": True})
        bridge.send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    port, root = int(sys.argv[1]), sys.argv[2]
    print(f"bare endpoint ready on 127.0.0.1:{port}", flush=True)
    uvicorn.run(
        Bare(root),
        host="127.0.0.1",
        port=port,
        http="httptools",
        log_level="warning",
        lifespan="off",
    )
