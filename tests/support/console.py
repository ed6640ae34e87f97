"""The web console for tests: the ASGI app served by a real uvicorn (in a thread, on a free
loopback port) over a running suite, and a small HTTP browser with a cookie jar that reads
CSRF tokens out of the pages the way a browser submits them (forms, hidden fields)."""

from __future__ import annotations

import contextlib
import html
import http.client
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import urlencode

from quarry.ports import free_port
from support.auth import TEST_CONSOLE_SESSION_KEY
from support.wait import wait_until

CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Answer:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), [""])[0]

    def csrf(self) -> str:
        found = CSRF_FIELD.search(self.text)
        assert found, "no CSRF field on the page"
        return html.unescape(found.group(1))


@dataclass
class Browser:
    """HTTP/1.1 to the console with cookies kept (what a browser sends back)."""

    port: int
    cookies: dict[str, str] = field(default_factory=dict)
    set_cookie_lines: list[str] = field(default_factory=list)
    keep_alive: bool = False  # one connection for every request, as a browser keeps one
    source: str = ""  # the loopback address to connect from ("" = the system's choice)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    tls: ssl.SSLContext | None = None  # HTTPS, verifying the console with this context
    _connection: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        if self.keep_alive and self._connection is not None:
            return self._connection
        source = (self.source, 0) if self.source else None
        connection = (
            http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=30, source_address=source, context=self.tls
            )
            if self.tls is not None
            else http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=30, source_address=source
            )
        )
        if self.keep_alive:
            self._connection = connection
        return connection

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        raw: tuple[str, bytes] | None = None,
    ) -> Answer:
        """`form` urlencoded, or `raw` = (content type, body) as given."""
        if self.keep_alive and self._connection is not None and method == "GET":
            try:
                return self._request(method, path, form, raw)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed the idle connection (uvicorn: after 5 s): a browser
                # opens a new one and sends the GET again.
                self._connection.close()
                self._connection = None
        return self._request(method, path, form, raw)

    def _request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None,
        raw: tuple[str, bytes] | None = None,
    ) -> Answer:
        connection = self._open()
        headers = dict(self.headers)
        body: str | bytes | None = None
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if form is not None:
            body = urlencode(form)
            headers["content-type"] = "application/x-www-form-urlencoded"
        if raw is not None:
            headers["content-type"], body = raw
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            got: dict[str, list[str]] = {}
            for name, value in response.getheaders():
                got.setdefault(name.lower(), []).append(value)
            answer = Answer(response.status, got, response.read())
        finally:
            if not self.keep_alive:
                connection.close()
        for line in answer.headers.get("set-cookie", []):
            self.set_cookie_lines.append(line)
            jar: SimpleCookie = SimpleCookie()
            jar.load(line)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return answer

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str]) -> Answer:
        return self.request("POST", path, form)

    def post_file(
        self, path: str, fields: dict[str, str], filename: str, data: bytes, field: str = "file"
    ) -> Answer:
        """A multipart/form-data post as a browser sends a form with a file input: the
        fields in order, then the file."""
        return self.request("POST", path, raw=multipart_body(fields, (field, filename, data)))

    def sign_in(self, key_id: str, secret: str) -> Answer:
        page = self.get("/login")
        return self.post(
            "/login",
            {"csrf": page.csrf(), "access_key_id": key_id, "secret_access_key": secret},
        )


def multipart_body(
    fields: dict[str, str], file: tuple[str, str, bytes] | None
) -> tuple[str, bytes]:
    """(content type, body) of a multipart/form-data form: `fields`, then `file` (field name,
    file name, bytes) sent as text/plain."""
    boundary = "----quarry-test-" + "x" * 16
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + value.encode()
            + b"\r\n"
        )
    if file is not None:
        name, filename, data = file
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: text/plain\r\n\r\n'.encode()
            + data
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", b"".join(parts)


@contextlib.contextmanager
def serving_console(suite, home, extra_env: dict[str, str] | None = None) -> Iterator[int]:
    """`quarry serve console` in its own process (as users run it) dialing `suite`; its
    port. Its log goes to HOME/console.log; `extra_env`: more settings of the process."""
    import subprocess
    import urllib.request

    from support.processes import VENV_BIN, quarry_env

    port = free_port()
    env = quarry_env(
        home,
        QUARRY_CONSOLE_PORT=str(port),
        QUARRY_BRANCH_MANAGER_ADDRESS=suite.targets["branch-manager"],
        QUARRY_COMMITTER_ADDRESS=suite.targets["committer"],
        QUARRY_LOG_LEVEL="WARNING",
        QUARRY_CONSOLE_SESSION_KEY=TEST_CONSOLE_SESSION_KEY,
    )
    env.update(extra_env or {})
    if "compactor-sensor" in suite.targets:
        env["QUARRY_COMPACTOR_SENSOR_ADDRESS"] = suite.targets["compactor-sensor"]
    with open(home / "console.log", "wb") as log:
        child = subprocess.Popen(
            [str(VENV_BIN / "quarry"), "serve", "console"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def up() -> bool:
        if child.poll() is not None:
            raise AssertionError(f"console exited: {(home / 'console.log').read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(up, timeout=30, interval=0.05, what="the console to answer")
        yield port
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextlib.contextmanager
def running_console(
    suite,
    secure: bool = False,
    session_key: str = TEST_CONSOLE_SESSION_KEY,
    **settings: object,
) -> Iterator[tuple[int, object]]:
    """(port, ConsoleApp) of a console over `suite`, served by uvicorn until the block ends;
    consoles with the same `session_key` accept each other's sessions. `settings`: settings
    of the console that differ from the suite's."""
    import dataclasses

    import grpc
    import uvicorn

    from quarry.auth.service_tokens import token_source
    from quarry.console.app import Console, ConsoleApp

    channels = [
        grpc.insecure_channel(suite.targets[name]) for name in ("branch-manager", "committer")
    ]
    sensor = (
        grpc.insecure_channel(suite.targets["compactor-sensor"])
        if "compactor-sensor" in suite.targets
        else None
    )
    own = dataclasses.replace(suite.settings, **settings) if settings else suite.settings
    console = Console(
        own,
        channels[0],
        channels[1],
        sensor,
        workers=8,
        secure=secure,
        session_key=session_key.encode(),
        relay=token_source(own, "console"),  # as services/console wires it
    )
    app = ConsoleApp(console)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, http="httptools", lifespan="off", log_config=None
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=20, interval=0.02, what="the console to start")
        yield port, app
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        app.close()
        for channel in channels + ([sensor] if sensor else []):
            channel.close()
