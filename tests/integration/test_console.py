"""The web console's ASGI app served by a real uvicorn over a real suite (gRPC servers on
loopback), driven over HTTP with a cookie jar: sign-in, sessions, CSRF, the pages, and the
rule that the console holds no privilege of its own (the user's token decides)."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarry.console import sessions
from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY
from support.console import Browser, running_console
from support.suite import suite_fixture

suite = suite_fixture(compactor_sensor=True)


@pytest.fixture(scope="module")
def console(suite):
    with running_console(suite) as (port, app):
        yield port, app


@pytest.fixture
def admin(console) -> Browser:
    browser = Browser(console[0])
    signed = browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
    assert signed.status == 303, signed.text
    return browser


def _stage(suite, client, repo: str, branch: str, path: str, data: bytes, **fields):
    store = Path(suite.namespace(repo)) / "data"
    store.mkdir(parents=True, exist_ok=True)
    target = store / hashlib.sha256(path.encode() + data).hexdigest()
    target.write_bytes(data)
    client.put_object(
        repo,
        branch,
        path=path,
        physical_address=str(target),
        size_bytes=len(data),
        checksum=hashlib.md5(data).hexdigest(),
        **fields,
    )


def _repo(suite, name: str) -> str:
    with suite.client() as client:
        client.create_repository(name, suite.namespace(name))
    return name


# ---- sign-in, sessions, CSRF ---------------------------------------------------------------


def test_sign_in_sets_a_strict_httponly_session_cookie_and_shows_the_user(console):
    browser = Browser(console[0])
    assert browser.get("/repos").status == 303  # not signed in: to the sign-in page
    signed = browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
    assert signed.status == 303 and signed.header("location") == "/repos"
    line = next(c for c in browser.set_cookie_lines if c.startswith(sessions.SESSION_COOKIE))
    assert "HttpOnly" in line and "SameSite=Strict" in line
    assert "Secure" not in line  # plaintext loopback: a Secure cookie would never come back
    page = browser.get("/repos")
    assert page.status == 200 and 'id="whoami">admin<' in page.text
    assert TEST_SECRET_ACCESS_KEY not in page.text and "token" not in browser.cookies


def test_a_wrong_secret_is_refused_with_no_session(console):
    browser = Browser(console[0])
    refused = browser.sign_in(TEST_ACCESS_KEY_ID, "not-the-secret")
    assert refused.status == 401 and "Sign-in refused" in refused.text
    assert sessions.SESSION_COOKIE not in browser.cookies
    assert browser.get("/repos").status == 303


def test_sign_in_without_the_forms_csrf_token_is_refused(console):
    browser = Browser(console[0])
    browser.get("/login")  # the login cookie is set, but the post names another token
    refused = browser.post(
        "/login",
        {
            "csrf": "forged",
            "access_key_id": TEST_ACCESS_KEY_ID,
            "secret_access_key": TEST_SECRET_ACCESS_KEY,
        },
    )
    assert refused.status == 403
    assert sessions.SESSION_COOKIE not in browser.cookies


def test_a_planted_session_id_is_never_adopted(console):
    """Session fixation: an attacker plants a session cookie in the victim's browser before
    sign-in. Sign-in must issue a new id, and the planted one must give nothing."""
    port, app = console
    planted = "attacker-chosen-session-id"
    victim = Browser(port, cookies={sessions.SESSION_COOKIE: planted})
    assert victim.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
    assert victim.cookies[sessions.SESSION_COOKIE] != planted
    attacker = Browser(port, cookies={sessions.SESSION_COOKIE: planted})
    assert attacker.get("/repos").status == 303  # to the sign-in page: no session
    # Signing in again (the same browser) rotates the id too: the old one is dead.
    before = victim.cookies[sessions.SESSION_COOKIE]
    assert victim.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
    assert victim.cookies[sessions.SESSION_COOKIE] != before
    assert app.sessions.get(before) is None
    stolen = Browser(port, cookies={sessions.SESSION_COOKIE: before})
    assert stolen.get("/repos").status == 303


def test_sign_ins_are_throttled_per_browser_address_before_auth_login(suite):
    """Auth/Login throttles per client address, and sees this console as one address for all
    its users: the console throttles each browser address itself, before calling Login, so
    one browser guessing secrets is refused (429, Retry-After) while another signs in."""
    with running_console(suite, console_login_attempts_per_minute_per_address=3) as (port, _):
        attacker = Browser(port, source="127.0.0.2")
        for _ in range(3):
            assert attacker.sign_in(TEST_ACCESS_KEY_ID, "a-guess").status == 401
        refused = attacker.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
        # Refused before Login (the right secret would have signed in): no session.
        assert refused.status == 429 and int(refused.header("retry-after")) >= 1
        assert 'id="error-code">RESOURCE_EXHAUSTED<' in refused.text
        assert "LOGIN_THROTTLED" in refused.text
        assert sessions.SESSION_COOKIE not in attacker.cookies
        # Another access key id from the same address: the address is what is spent.
        assert attacker.sign_in("AKIAQSOMEONEELSE0001", "x").status == 429
        # Another browser behind the same console still signs in.
        other = Browser(port, source="127.0.0.3")
        assert other.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303


def test_a_post_without_the_sessions_csrf_token_changes_nothing(suite, admin):
    namespace = suite.namespace("csrf-repo")
    for form in (
        {"name": "csrf-repo", "storage_namespace": namespace},
        {"name": "csrf-repo", "storage_namespace": namespace, "csrf": "guessed"},
    ):
        refused = admin.post("/repos", form)
        assert refused.status == 403 and "CSRF_TOKEN_INVALID" in refused.text
    with suite.client() as client:
        assert "csrf-repo" not in [r.name for r in client.iter_repositories()]


def test_sign_out_forgets_the_session(console, admin):
    session_id = admin.cookies[sessions.SESSION_COOKIE]
    page = admin.get("/repos")
    assert admin.post("/logout", {"csrf": page.csrf()}).status == 303
    assert sessions.SESSION_COOKIE not in admin.cookies
    replay = Browser(console[0], cookies={sessions.SESSION_COOKIE: session_id})
    assert replay.get("/repos").status == 303


def test_a_session_survives_a_console_restart_and_works_on_every_replica(suite, tmp_path):
    """Sessions are sealed in their cookie under the shared session key: two `quarry serve
    console` processes (replicas) accept each other's sessions, and a console started after
    the first stopped (a restart) still does, CSRF token included."""
    from support.console import serving_console

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with serving_console(suite, tmp_path / "a") as first:
        browser = Browser(first)
        assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
        with serving_console(suite, tmp_path / "b") as second:
            replica = Browser(second, cookies=dict(browser.cookies))
            assert 'id="whoami">admin<' in replica.get("/repos").text
    with serving_console(suite, tmp_path / "a") as restarted:
        again = Browser(restarted, cookies=dict(browser.cookies))
        page = again.get("/repos")
        assert page.status == 200 and 'id="whoami">admin<' in page.text
        namespace = suite.namespace("after-restart")
        made = again.post(
            "/repos",
            {"csrf": page.csrf(), "name": "after-restart", "storage_namespace": namespace},
        )
        assert made.status == 303, made.text
        # Sign-out on this process: the cookie is refused here from now on.
        assert again.post("/logout", {"csrf": page.csrf()}).status == 303
        replay = Browser(restarted, cookies=dict(browser.cookies))
        assert replay.get("/repos").status == 303
    with suite.client() as client:
        assert client.get_repository("after-restart").name == "after-restart"


def test_a_tampered_or_foreign_session_cookie_is_refused(suite, console, admin):
    sealed = admin.cookies[sessions.SESSION_COOKIE]
    body = sealed[: len(sealed) // 2]
    flipped = "A" if sealed[len(sealed) // 2] != "A" else "B"
    tampered = body + flipped + sealed[len(sealed) // 2 + 1 :]
    assert (
        Browser(console[0], cookies={sessions.SESSION_COOKIE: tampered}).get("/repos").status == 303
    )
    # A console with another session key (another deployment) opens none of ours, and its
    # cookies open nowhere here.
    with running_console(suite, session_key="another-deployments-session-key-0123456") as (
        port,
        _app,
    ):
        assert Browser(port, cookies=dict(admin.cookies)).get("/repos").status == 303
        foreign = Browser(port)
        assert foreign.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
    stranger = Browser(console[0], cookies=dict(foreign.cookies))
    assert stranger.get("/repos").status == 303
    assert admin.get("/repos").status == 200  # the genuine one still works


# ---- pages ---------------------------------------------------------------------------------


def test_create_and_delete_a_repository_needs_its_name_typed_again(suite, admin):
    page = admin.get("/repos")
    namespace = suite.namespace("made-in-console")
    made = admin.post(
        "/repos",
        {"csrf": page.csrf(), "name": "made-in-console", "storage_namespace": namespace},
    )
    assert made.status == 303 and made.header("location") == "/repos/made-in-console/objects"
    assert "made-in-console" in admin.get("/repos").text
    confirm = admin.get("/repos/made-in-console/delete")
    wrong = admin.post(
        "/repos/made-in-console/delete", {"csrf": confirm.csrf(), "confirm": "made-in-consol"}
    )
    assert wrong.status == 400
    with suite.client() as client:
        assert client.get_repository("made-in-console").name == "made-in-console"
    gone = admin.post(
        "/repos/made-in-console/delete", {"csrf": confirm.csrf(), "confirm": "made-in-console"}
    )
    assert gone.status == 303
    assert admin.get("/repos/made-in-console/objects").status == 404


def test_browse_folders_pages_preview_and_download(suite, admin):
    repo = _repo(suite, "browse")
    table = pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    with suite.client() as client:
        _stage(suite, client, repo, "main", "docs/readme.txt", b"hello <console>\n")
        _stage(suite, client, repo, "main", "tables/t/part-0.parquet", buffer.getvalue())
        for i in range(130):
            _stage(suite, client, repo, "main", f"many/f{i:03d}.csv", b"x,y\n")
        client.commit(repo, "main", "data")
    top = admin.get(f"/repos/{repo}/objects?ref=main")
    assert top.status == 200
    assert re.search(r'class="folder".*prefix=docs%2F', top.text)
    first = admin.get(f"/repos/{repo}/objects?ref=main&prefix=many%2F")
    assert first.text.count('class="object"') == 100
    next_link = re.search(r'id="next-page" rel="next" href="([^"]+)"', first.text)
    assert next_link, "a full page links to the next one"
    second = admin.get(next_link.group(1).replace("&amp;", "&"))
    assert second.text.count('class="object"') == 30 and "f129.csv" in second.text
    text = admin.get(f"/repos/{repo}/object?ref=main&path=docs%2Freadme.txt")
    assert "hello &lt;console&gt;" in text.text  # escaped, never markup
    parquet = admin.get(f"/repos/{repo}/object?ref=main&path=tables%2Ft%2Fpart-0.parquet")
    assert 'id="parquet-schema"' in parquet.text and "int64" in parquet.text
    assert ">b</td>" in parquet.text and "3 rows" in parquet.text
    got = admin.get(f"/repos/{repo}/download?ref=main&path=tables%2Ft%2Fpart-0.parquet")
    assert got.status == 200 and got.body == buffer.getvalue()
    assert got.header("content-disposition").startswith("attachment")


def test_commit_and_discard_in_the_console(suite, admin):
    repo = _repo(suite, "staging")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "a.txt", b"a")
        _stage(suite, client, repo, "main", "b.txt", b"b")
    changes = admin.get(f"/repos/{repo}/changes?branch=main")
    assert changes.text.count('class="change"') == 2 and 'id="commit-form"' in changes.text
    branches = admin.get(f"/repos/{repo}/branches")
    assert 'class="dirty"' in branches.text
    made = admin.post(
        f"/repos/{repo}/commit",
        {"csrf": changes.csrf(), "branch": "main", "message": "from the console"},
    )
    assert made.status == 303
    detail = admin.get(made.header("location"))
    # Its diff against its parent: the two staged objects.
    assert "from the console" in detail.text and detail.text.count('class="change"') == 2
    with suite.client() as client:
        assert client.get_commit(repo, "main").message == "from the console"
        _stage(suite, client, repo, "main", "c.txt", b"c")
    page = admin.get(f"/repos/{repo}/changes?branch=main")
    assert (
        admin.post(f"/repos/{repo}/discard", {"csrf": page.csrf(), "branch": "main"}).status == 303
    )
    with suite.client() as client:
        assert list(client.iter_uncommitted(repo, "main")) == []


def test_compare_merge_dry_run_shows_conflicts_then_merges(suite, admin):
    repo = _repo(suite, "merging")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "shared.txt", b"base")
        client.commit(repo, "main", "base")
        client.create_branch(repo, "feature", "main")
        _stage(suite, client, repo, "feature", "shared.txt", b"feature side")
        _stage(suite, client, repo, "feature", "new.txt", b"new")
        client.commit(repo, "feature", "feature work")
        _stage(suite, client, repo, "main", "shared.txt", b"main side")
        client.commit(repo, "main", "main work")
    three = admin.get(f"/repos/{repo}/compare?left=main&right=feature&mode=three")
    # Three-dot: what feature did since the merge base; shared.txt changed on both sides.
    assert "1 added" in three.text and "1 conflict" in three.text
    two = admin.get(f"/repos/{repo}/compare?left=main&right=feature&mode=two")
    assert "1 added" in two.text and "1 changed" in two.text
    dry = admin.get(f"/repos/{repo}/merge?source=feature&destination=main")
    assert dry.status == 200 and 'class="conflict-row"' in dry.text and "shared.txt" in dry.text
    assert 'id="merge-form"' not in dry.text  # no merge button while it would conflict
    with suite.client() as client:  # resolve on the feature branch
        _stage(suite, client, repo, "feature", "shared.txt", b"main side")
        client.commit(repo, "feature", "resolve")
    clean = admin.get(f"/repos/{repo}/merge?source=feature&destination=main")
    assert 'id="merge-summary"' in clean.text and 'id="merge-form"' in clean.text
    merged = admin.post(
        f"/repos/{repo}/merge",
        {"csrf": clean.csrf(), "source": "feature", "destination": "main", "message": "m"},
    )
    assert merged.status == 303
    log = admin.get(f"/repos/{repo}/log?ref=main")
    assert '<svg class="graph"' in log.text and "merge</span>" in log.text
    # Two parents drawn: at least one line leaves the merge commit's lane sideways.
    assert re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="(?!\1")', log.text)


def test_error_pages_carry_the_status_and_reason_never_a_trace(admin):
    page = admin.get("/repos/no-such-repo/objects")
    assert page.status == 404
    assert 'id="error-code">NOT_FOUND<' in page.text
    assert re.search(r'id="error-reason">[A-Z_]+<', page.text)
    assert "Traceback" not in page.text and 'File "' not in page.text
    assert admin.get("/no/such/page").status == 404


# ---- a read-only user ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def viewer(suite, console):
    with suite.client() as client:
        client.create_user("viewer-user")
        client.add_group_member("Viewers", "viewer-user")
        made = client.create_credentials("viewer-user")
    browser = Browser(console[0])
    key = made.credentials.access_key_id, made.secret_access_key
    assert browser.sign_in(*key).status == 303
    return browser


def test_a_read_only_user_sees_no_write_controls(suite, viewer):
    repo = _repo(suite, "read-only")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "x.txt", b"x")
    repos = viewer.get("/repos")
    assert repos.status == 200 and repo in repos.text
    assert 'id="create-repository"' not in repos.text and "delete…" not in repos.text
    changes = viewer.get(f"/repos/{repo}/changes?branch=main")
    assert changes.status == 200 and 'class="change"' in changes.text
    assert 'id="commit-form"' not in changes.text and 'id="discard-form"' not in changes.text
    assert 'id="create-branch"' not in viewer.get(f"/repos/{repo}/branches").text


def test_a_forged_form_from_a_read_only_user_is_permission_denied(suite, viewer):
    """The console holds no privilege: a form the page never offered, posted with the
    user's own valid session and CSRF token, reaches the servers with the user's token and
    is refused there."""
    repo = _repo(suite, "forged")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "x.txt", b"x")
        head = client.get_branch(repo, "main").commit_id
    csrf = viewer.get("/repos").csrf()
    for path, form in (
        (f"/repos/{repo}/commit", {"branch": "main", "message": "forged"}),
        (f"/repos/{repo}/discard", {"branch": "main"}),
        (f"/repos/{repo}/delete", {"confirm": repo}),
        ("/repos", {"name": "forged-new", "storage_namespace": suite.namespace("forged-new")}),
    ):
        refused = viewer.post(path, {"csrf": csrf, **form})
        assert refused.status == 403, (path, refused.text)
        assert 'id="error-code">PERMISSION_DENIED<' in refused.text
    with suite.client() as client:
        assert client.get_branch(repo, "main").commit_id == head
        assert [c.path for c in client.iter_uncommitted(repo, "main")] == ["x.txt"]
        assert "forged-new" not in [r.name for r in client.iter_repositories()]


def test_a_developer_sees_the_write_controls_their_policies_allow(suite, console):
    """The controls follow the user's own policies (read with WhoAmI's
    include_effective_policies), not a blanket rule: a Developers member may commit and
    create branches, but not manage repositories."""
    repo = _repo(suite, "developer")
    with suite.client() as client:
        client.create_user("dev-user")
        client.add_group_member("Developers", "dev-user")
        made = client.create_credentials("dev-user")
        _stage(suite, client, repo, "main", "x.txt", b"x")
    browser = Browser(console[0])
    assert browser.sign_in(made.credentials.access_key_id, made.secret_access_key).status == 303
    changes = browser.get(f"/repos/{repo}/changes?branch=main")
    assert 'id="commit-form"' in changes.text
    assert 'id="create-branch"' in browser.get(f"/repos/{repo}/branches").text
    repos = browser.get("/repos")
    assert 'id="create-repository"' not in repos.text and "delete…" not in repos.text


def test_under_tls_the_session_cookie_is_secure(suite):
    # The app as `quarry serve console` runs it with a certificate (Console.secure); the
    # cookie attributes are what is checked, so plain HTTP carries the exchange here.
    with running_console(suite, secure=True) as (port, _app):
        browser = Browser(port)
        assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
    lines = [c for c in browser.set_cookie_lines if c.startswith(sessions.SESSION_COOKIE)]
    assert lines and all("Secure" in c and "HttpOnly" in c for c in lines)


def test_quarry_serve_console_answers_health_metrics_and_json_logs(suite, tmp_path):
    """The service as users run it: its own process, metrics on the base port + 6 (its index
    in quarry.config.SERVICES), one JSON log line per request."""
    import json
    import urllib.request

    from support.console import serving_console
    from support.ports import free_port

    metrics_port = free_port()
    extra = {
        "QUARRY_METRICS_BASE_PORT": str(metrics_port - 6),
        "QUARRY_LOG_FORMAT": "json",
        "QUARRY_LOG_LEVEL": "INFO",
    }
    with serving_console(suite, tmp_path, extra) as port:
        browser = Browser(port)
        assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
        assert browser.get("/repos").status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
    assert 'quarry_console_requests_total{route="repositories",status="200"} 1.0' in metrics
    lines = [json.loads(line) for line in (tmp_path / "console.log").read_text().splitlines()]
    assert any(
        "console repositories GET /repos -> 200" in line.get("message", "") for line in lines
    )
