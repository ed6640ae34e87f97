"""The web console's ASGI app served by a real uvicorn over a real suite (gRPC servers on
loopback), driven over HTTP with a cookie jar: sign-in, sessions, CSRF, the pages, and the
rule that the console holds no privilege of its own (the user's token decides)."""

from __future__ import annotations

import hashlib
import html
import io
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarry.console import sessions
from quarry.v1 import branch_manager_pb2 as bm
from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY
from support.console import Answer, Browser, running_console
from support.suite import suite_fixture

# Every sign-in of this module comes from one address (loopback) with a few access keys: on
# the default limits (20 a minute per address at the console, 60 per key) a fast run of its
# tests gets 429 after its twentieth sign-in. The limits are tested on consoles of their own
# (test_sign_ins_are_throttled_per_browser_address_before_auth_login); here they are set far
# above what the module uses.
SIGN_IN_LIMITS = {
    "auth_login_attempts_per_minute_per_key": 10_000,
    "auth_login_attempts_per_minute_per_address": 10_000,
}
suite = suite_fixture(compactor_sensor=True, **SIGN_IN_LIMITS)


@pytest.fixture(scope="module")
def console(suite):
    with running_console(suite, console_login_attempts_per_minute_per_address=10_000) as (
        port,
        app,
    ):
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


def test_a_post_from_another_origin_is_refused_even_with_a_planted_csrf_cookie(console, admin):
    """Login CSRF: cookies ignore ports, so a page on another port of the same host can
    plant the sign-in form's double-submit cookie and post matching credentials — the
    victim would be signed in as the attacker. The browser's own headers say where a post
    comes from: anything but the console's own pages is refused, sign-in included."""
    port, _app = console
    victim = Browser(port)
    page = victim.get("/login")  # stands in for the planted cookie: a valid pair
    form = {
        "csrf": page.csrf(),
        "access_key_id": TEST_ACCESS_KEY_ID,
        "secret_access_key": TEST_SECRET_ACCESS_KEY,
    }
    for headers in (
        {"sec-fetch-site": "same-site", "origin": f"http://127.0.0.1:{port + 1}"},
        {"sec-fetch-site": "cross-site"},
        {"origin": f"http://127.0.0.1:{port + 1}"},  # an older browser: Origin alone
        {"origin": "null"},
    ):
        victim.headers = dict(headers)
        refused = victim.post("/login", form)
        assert refused.status == 403 and "CROSS_ORIGIN" in refused.text, headers
        assert sessions.SESSION_COOKIE not in victim.cookies
    # A signed-in user's forms too, whatever token they carry.
    changes = admin.get("/repos")
    admin.headers = {"sec-fetch-site": "same-site"}
    assert admin.post("/logout", {"csrf": changes.csrf()}).status == 403
    admin.headers = {}
    # The console's own pages: Sec-Fetch-Site same-origin, or an Origin naming its host.
    for headers in (
        {"sec-fetch-site": "same-origin", "origin": f"http://127.0.0.1:{port}"},
        {"origin": f"http://127.0.0.1:{port}"},
    ):
        victim.headers = dict(headers)
        page = victim.get("/login")
        assert victim.post("/login", {**form, "csrf": page.csrf()}).status == 303, headers


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
    # Merged already: the dry run says so (as `quarry merge` does), not a NO_CHANGES page.
    again = admin.get(f"/repos/{repo}/merge?source=feature&destination=main")
    assert again.status == 200 and 'id="merge-nothing"' in again.text
    assert 'id="merge-form"' not in again.text


def test_error_pages_carry_the_status_and_reason_never_a_trace(admin):
    page = admin.get("/repos/no-such-repo/objects")
    assert page.status == 404
    assert 'id="error-code">NOT_FOUND<' in page.text
    assert re.search(r'id="error-reason">[A-Z_]+<', page.text)
    assert "Traceback" not in page.text and 'File "' not in page.text
    assert admin.get("/no/such/page").status == 404


def _error(answer, status: int, reason: str) -> None:
    """An error page with `status` and the gRPC `reason` shown, never a trace."""
    assert answer.status == status, (answer.status, answer.text[-600:])
    assert f'id="error-reason">{reason}<' in answer.text, answer.text[-600:]
    assert "Traceback" not in answer.text


def test_create_a_tag_from_a_branch_and_delete_it_after_confirming(suite, admin):
    repo = _repo(suite, "tagging")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "a.txt", b"a")
        head = client.commit(repo, "main", "one").commit.id
    branches = admin.get(f"/repos/{repo}/branches")
    assert f'href="/repos/{repo}/tags?ref=main">tag…<' in branches.text
    page = admin.get(f"/repos/{repo}/tags?ref=main")
    assert 'id="create-tag"' in page.text and 'id="tag-ref" value="main"' in page.text
    made = admin.post(f"/repos/{repo}/tags", {"csrf": page.csrf(), "name": "v1", "ref": "main"})
    assert made.status == 303 and made.header("location") == f"/repos/{repo}/tags"
    listed = admin.get(f"/repos/{repo}/tags")
    assert ">v1</a>" in listed.text and head[:12] in listed.text
    confirm = admin.get(f"/repos/{repo}/tags/delete?tag=v1")
    assert confirm.status == 200 and 'name="confirm" value="v1"' in confirm.text
    gone = admin.post(
        f"/repos/{repo}/tags/delete", {"csrf": confirm.csrf(), "tag": "v1", "confirm": "v1"}
    )
    assert gone.status == 303
    with suite.client() as client:
        assert [t.name for t in client.iter_tags(repo)] == []


def test_a_tag_is_never_deleted_without_csrf_and_confirmation(suite, admin):
    """The deletion guard (quarry.console.forms.confirmed and the app's CSRF check): a post
    that lacks the CSRF token, lacks the confirmation, or confirms another name deletes
    nothing."""
    repo = _repo(suite, "tag-guard")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "a.txt", b"a")
        client.commit(repo, "main", "one")
        client.create_tag(repo, "keep", "main")
    csrf = admin.get(f"/repos/{repo}/tags").csrf()
    _error(
        admin.post(f"/repos/{repo}/tags/delete", {"tag": "keep", "confirm": "keep"}),
        403,
        "CSRF_TOKEN_INVALID",
    )
    _error(
        admin.post(f"/repos/{repo}/tags/delete", {"csrf": csrf, "tag": "keep"}),
        400,
        "CONFIRMATION_REQUIRED",
    )
    _error(
        admin.post(f"/repos/{repo}/tags/delete", {"csrf": csrf, "tag": "keep", "confirm": "kee"}),
        400,
        "CONFIRMATION_REQUIRED",
    )
    _error(
        admin.post(f"/repos/{repo}/tags", {"name": "forged", "ref": "main"}),
        403,
        "CSRF_TOKEN_INVALID",
    )
    with suite.client() as client:
        assert [t.name for t in client.iter_tags(repo)] == ["keep"]


def test_bad_tag_forms_get_a_clear_error_page(suite, admin):
    repo = _repo(suite, "tag-bad")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "a.txt", b"a")
        client.commit(repo, "main", "one")
        client.create_tag(repo, "taken", "main")
    csrf = admin.get(f"/repos/{repo}/tags").csrf()
    _error(
        admin.post(f"/repos/{repo}/tags", {"csrf": csrf, "name": "", "ref": "main"}),
        400,
        "FORM_FIELD_MISSING",
    )
    missing = admin.post(f"/repos/{repo}/tags", {"csrf": csrf, "name": "t", "ref": "no-such"})
    assert missing.status in (400, 404) and 'id="error-reason">' in missing.text
    assert "Traceback" not in missing.text
    taken = admin.post(f"/repos/{repo}/tags", {"csrf": csrf, "name": "taken", "ref": "main"})
    assert taken.status == 409 and 'id="error-code">ALREADY_EXISTS<' in taken.text
    assert admin.get(f"/repos/{repo}/tags/delete?tag=no-such").status == 404


def _files(suite, repo: str) -> set[str]:
    """Every file in the repository's storage namespace (its object bytes)."""
    root = Path(suite.namespace(repo))
    return {str(f.relative_to(root)) for f in root.rglob("*") if f.is_file()}


def test_upload_through_the_object_browser_stores_the_bytes_and_stages_them(suite, admin):
    repo = _repo(suite, "uploads")
    before = _files(suite, repo)
    page = admin.get(f"/repos/{repo}/objects?ref=main&prefix=docs%2F")
    assert 'enctype="multipart/form-data"' in page.text
    assert 'id="upload-path" value="docs/"' in page.text
    # Uploads go to branches only: the form on any branch, none at a tag or a commit.
    with suite.client() as client:
        head = client.get_branch(repo, "main").commit_id
        client.create_tag(repo, "uploads-tag", head)
        client.create_branch(repo, "uploads-dev", head)
    for ref, offered in (("uploads-dev", True), ("uploads-tag", False), (head, False)):
        at = admin.get(f"/repos/{repo}/objects?ref={ref}")
        assert at.status == 200 and ('id="upload-form"' in at.text) == offered, ref
    data = b"hello from the console\n" * 1000
    made = admin.post_file(
        f"/repos/{repo}/upload",
        {"csrf": page.csrf(), "branch": "main", "path": "docs/"},
        "hello.txt",
        data,
    )
    assert made.status == 303, made.text[-600:]
    assert made.header("location") == f"/repos/{repo}/changes?branch=main"
    changes = admin.get(made.header("location"))
    assert "docs/hello.txt" in changes.text and 'class="added"' in changes.text
    with suite.client() as client:
        entry = client.stat_object(repo, "main", "docs/hello.txt")
    assert entry.size_bytes == len(data) and entry.checksum == hashlib.md5(data).hexdigest()
    assert entry.content_type == "text/plain"
    new = _files(suite, repo) - before
    assert len(new) == 1 and next(iter(new)).startswith("data/")  # one fresh key, as PutObject
    assert admin.get(f"/repos/{repo}/download?ref=main&path=docs%2Fhello.txt").body == data
    # A path named in full is used as given.
    named = admin.post_file(
        f"/repos/{repo}/upload",
        {"csrf": page.csrf(), "branch": "main", "path": "elsewhere/renamed.csv"},
        "local-name.csv",
        b"a,b\n",
    )
    assert named.status == 303
    with suite.client() as client:
        assert client.stat_object(repo, "main", "elsewhere/renamed.csv").size_bytes == 4


def test_an_upload_without_the_csrf_token_writes_no_byte(suite, admin):
    repo = _repo(suite, "upload-csrf")
    before = _files(suite, repo)
    for fields in ({"branch": "main", "path": ""}, {"csrf": "guessed", "branch": "main"}):
        refused = admin.post_file(f"/repos/{repo}/upload", fields, "x.txt", b"x" * 5000)
        _error(refused, 403, "CSRF_TOKEN_INVALID")
    assert _files(suite, repo) == before
    with suite.client() as client:
        assert list(client.iter_uncommitted(repo, "main")) == []


def test_bad_uploads_get_a_clear_error_page_and_leave_nothing(suite, admin):
    repo = _repo(suite, "upload-bad")
    with suite.client() as client:
        client.create_tag(repo, "v0", "main")
        client.set_branch_protection_rules(
            repo,
            [
                bm.BranchProtectionRule(
                    pattern="main",
                    blocked_actions=[bm.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE],
                )
            ],
        )
        client.create_branch(repo, "open", "main")
    before = _files(suite, repo)
    csrf = admin.get(f"/repos/{repo}/objects?ref=open").csrf()
    url = f"/repos/{repo}/upload"
    _error(admin.post_file(url, {"csrf": csrf, "branch": "v0"}, "x.txt", b"x"), 409, "NOT_A_BRANCH")
    _error(
        admin.post_file(url, {"csrf": csrf, "branch": "open"}, "", b""), 400, "FORM_FIELD_MISSING"
    )
    broken = admin.request(
        "POST", url, raw=("multipart/form-data; boundary=abc", b"--abc\r\nno headers end")
    )
    _error(broken, 400, "MALFORMED_FORM")
    # The servers decide: the admin may write, but main's protection refuses the staging;
    # the bytes written before it are removed.
    protected = admin.post_file(url, {"csrf": csrf, "branch": "main"}, "x.txt", b"x" * 3000)
    assert protected.status in (403, 409), protected.text[-600:]
    assert 'id="error-reason">' in protected.text and "Traceback" not in protected.text
    assert _files(suite, repo) == before
    with suite.client() as client:
        assert list(client.iter_uncommitted(repo, "main")) == []
        assert list(client.iter_uncommitted(repo, "open")) == []


def test_a_dropped_upload_leaves_no_bytes_and_stages_nothing(suite, console, admin):
    """The connection closes mid-file: the bytes already written (the store's temporary
    file) are gone and no entry is staged."""
    import socket

    from support.console import multipart_body
    from support.wait import wait_until

    repo = _repo(suite, "upload-dropped")
    csrf = admin.get(f"/repos/{repo}/objects").csrf()
    before = _files(suite, repo)
    ctype, body = multipart_body(
        {"csrf": csrf, "branch": "main"}, ("file", "cut.bin", b"c" * (4 << 20))
    )
    cookie = "; ".join(f"{k}={v}" for k, v in admin.cookies.items())
    head = (
        f"POST /repos/{repo}/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n"
        f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", console[0]), timeout=30) as sock:
        sock.sendall(head + body[: 1 << 20])  # a quarter of the file, then the line drops
        wait_until(
            lambda: len(_files(suite, repo)) > len(before), timeout=30, what="bytes being written"
        )
    wait_until(lambda: _files(suite, repo) == before, timeout=30, what="the bytes removed")
    with suite.client() as client:
        assert list(client.iter_uncommitted(repo, "main")) == []


def test_an_upload_over_the_limit_is_refused_and_nothing_is_kept(suite):
    """QUARRY_CONSOLE_MAX_UPLOAD_BYTES bounds the streamed file: past it, the bytes written
    so far are removed and nothing is staged."""
    repo = _repo(suite, "upload-limit")
    with running_console(suite, console_max_upload_bytes=4096) as (port, _app):
        browser = Browser(port)
        assert browser.sign_in(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY).status == 303
        csrf = browser.get(f"/repos/{repo}/objects").csrf()
        before = _files(suite, repo)
        url = f"/repos/{repo}/upload"
        over = browser.post_file(url, {"csrf": csrf, "branch": "main"}, "big.bin", b"b" * 4097)
        _error(over, 413, "UPLOAD_TOO_LARGE")
        assert _files(suite, repo) == before
        with suite.client() as client:
            assert list(client.iter_uncommitted(repo, "main")) == []
        # A body whose declared length is already over the limit is refused before it is read.
        declared = browser.post_file(
            url, {"csrf": csrf, "branch": "main"}, "huge.bin", b"h" * (2 << 20)
        )
        _error(declared, 413, "UPLOAD_TOO_LARGE")
        assert _files(suite, repo) == before
        at = browser.post_file(url, {"csrf": csrf, "branch": "main"}, "fits.bin", b"f" * 4096)
        assert at.status == 303
    with suite.client() as client:
        assert client.stat_object(repo, "main", "fits.bin").size_bytes == 4096


# ---- admin pages ---------------------------------------------------------------------------


def test_an_admin_creates_a_user_and_credentials_shown_once(suite, console, admin):
    users = admin.get("/admin/users")
    assert 'id="create-user"' in users.text
    made = admin.post("/admin/users", {"csrf": users.csrf(), "user_id": "ada", "email": ""})
    assert made.status == 303 and made.header("location") == "/admin/users/ada"
    page = admin.get("/admin/users/ada")
    assert 'id="create-credentials"' in page.text and 'id="delete-user"' in page.text
    created = admin.post("/admin/users/ada/credentials", {"csrf": page.csrf()})
    assert created.status == 200 and created.header("cache-control") == "no-store"
    key_id = re.search(r'id="new-access-key-id">([^<]+)<', created.text).group(1)
    secret = re.search(r'id="new-secret-access-key">([^<]+)<', created.text).group(1)
    again = admin.get("/admin/users/ada")
    assert key_id in again.text and secret not in again.text  # the secret: this once only
    assert secret not in admin.get("/admin/users/ada/credentials").text
    ada = Browser(console[0])
    assert ada.sign_in(key_id, secret).status == 303
    assert 'id="whoami">ada<' in ada.get("/repos").text
    # Delete the credentials (after confirming): that key signs in no more.
    confirm = admin.get(f"/admin/users/ada/credentials/delete?key={key_id}")
    assert f'name="confirm" value="{key_id}"' in confirm.text
    gone = admin.post(
        "/admin/users/ada/credentials/delete",
        {"csrf": confirm.csrf(), "key": key_id, "confirm": key_id},
    )
    assert gone.status == 303
    assert Browser(console[0]).sign_in(key_id, secret).status == 401
    confirm = admin.get("/admin/users/ada/delete")
    assert (
        admin.post("/admin/users/ada/delete", {"csrf": confirm.csrf(), "confirm": "ada"}).status
        == 303
    )
    with suite.client() as client:
        assert "ada" not in [u.id for u in client.iter_users()]


def test_groups_members_and_policies_edited_in_the_admin_pages(suite, admin):
    with suite.client() as client:
        client.create_user("grace")
    csrf = admin.get("/admin/groups").csrf()
    assert admin.post("/admin/groups", {"csrf": csrf, "group_id": "analysts"}).status == 303
    document = '{"Statement": [{"Effect": "Allow", "Action": ["fs:ReadObject"], "Resource": "*"}]}'
    made = admin.post(
        "/admin/policies", {"csrf": csrf, "policy_id": "ReadObjects", "document": document}
    )
    assert made.status == 303 and "ReadObjects" in admin.get("/admin/policies").text
    for path, form in (
        ("/admin/groups/analysts/members", {"user": "grace"}),
        ("/admin/groups/analysts/policies", {"policy": "ReadObjects"}),
        ("/admin/users/grace/policies", {"policy": "FSReadAll"}),
    ):
        assert admin.post(path, {"csrf": csrf, **form}).status == 303, path
    group = admin.get("/admin/groups/analysts")
    assert ">grace</a>" in group.text and "ReadObjects" in group.text
    user = admin.get("/admin/users/grace")
    assert ">analysts</a>" in user.text and "FSReadAll" in user.text
    with suite.client() as client:
        assert [u.id for u in client.iter_group_members("analysts")] == ["grace"]
        assert [p.id for p in client.iter_group_policies("analysts")] == ["ReadObjects"]
        assert [p.id for p in client.iter_user_policies("grace")] == ["FSReadAll"]
    # Each undone from its confirmation page.
    for confirm_path, post_path, form in (
        (
            "/admin/users/grace/policies/detach?policy=FSReadAll",
            "/admin/users/grace/policies/detach",
            {"policy": "FSReadAll", "confirm": "FSReadAll"},
        ),
        (
            "/admin/groups/analysts/policies/detach?policy=ReadObjects",
            "/admin/groups/analysts/policies/detach",
            {"policy": "ReadObjects", "confirm": "ReadObjects"},
        ),
        (
            "/admin/groups/analysts/members/remove?user=grace",
            "/admin/groups/analysts/members/remove",
            {"user": "grace", "confirm": "grace"},
        ),
        ("/admin/groups/analysts/delete", "/admin/groups/analysts/delete", {"confirm": "analysts"}),
        (
            "/admin/policies/delete?policy=ReadObjects",
            "/admin/policies/delete",
            {"policy": "ReadObjects", "confirm": "ReadObjects"},
        ),
    ):
        confirm = admin.get(confirm_path)
        assert confirm.status == 200 and 'id="confirm-form"' in confirm.text, confirm_path
        assert admin.post(post_path, {"csrf": confirm.csrf(), **form}).status == 303, post_path
    with suite.client() as client:
        assert list(client.iter_user_policies("grace")) == []
        assert "analysts" not in [g.id for g in client.iter_groups()]
        assert "ReadObjects" not in [p.id for p in client.iter_policies()]
        assert [u.id for u in client.iter_users() if u.id == "grace"] == ["grace"]


def test_admin_deletions_never_happen_without_csrf_and_confirmation(suite, admin):
    """The guard of every destructive admin form (quarry.console.forms.confirmed and the
    app's CSRF check): without the CSRF token, without the confirmation, or confirming
    another name, nothing is deleted, removed or detached."""
    with suite.client() as client:
        client.create_user("kept-user")
        key = client.create_credentials("kept-user").credentials.access_key_id
        client.create_group("kept-group")
        client.add_group_member("kept-group", "kept-user")
        client.attach_policy("FSReadAll", group="kept-group")
    csrf = admin.get("/admin/users").csrf()
    cases = (
        ("/admin/users/kept-user/delete", {}, "kept-user"),
        ("/admin/users/kept-user/credentials/delete", {"key": key}, key),
        ("/admin/groups/kept-group/delete", {}, "kept-group"),
        ("/admin/groups/kept-group/members/remove", {"user": "kept-user"}, "kept-user"),
        ("/admin/groups/kept-group/policies/detach", {"policy": "FSReadAll"}, "FSReadAll"),
        ("/admin/policies/delete", {"policy": "FSReadAll"}, "FSReadAll"),
    )
    for path, form, name in cases:
        _error(admin.post(path, {**form, "confirm": name}), 403, "CSRF_TOKEN_INVALID")
        _error(admin.post(path, {"csrf": csrf, **form}), 400, "CONFIRMATION_REQUIRED")
        _error(
            admin.post(path, {"csrf": csrf, **form, "confirm": name + "x"}),
            400,
            "CONFIRMATION_REQUIRED",
        )
    with suite.client() as client:
        assert "kept-user" in [u.id for u in client.iter_users()]
        assert [c.access_key_id for c in client.iter_credentials("kept-user")] == [key]
        assert [u.id for u in client.iter_group_members("kept-group")] == ["kept-user"]
        assert [p.id for p in client.iter_group_policies("kept-group")] == ["FSReadAll"]
        assert "FSReadAll" in [p.id for p in client.iter_policies()]


def test_admin_forms_without_the_csrf_token_change_nothing(suite, admin):
    with suite.client() as client:
        client.create_user("csrf-user")
        client.create_group("csrf-group")
        keys = len(list(client.iter_credentials("csrf-user")))
    document = '{"Statement": [{"Effect": "Allow", "Action": ["fs:ReadObject"], "Resource": "*"}]}'
    for path, form in (
        ("/admin/users", {"user_id": "csrf-new-user"}),
        ("/admin/groups", {"group_id": "csrf-new-group"}),
        ("/admin/policies", {"policy_id": "CsrfPolicy", "document": document}),
        ("/admin/groups/csrf-group/members", {"user": "csrf-user"}),
        ("/admin/groups/csrf-group/policies", {"policy": "FSReadAll"}),
        ("/admin/users/csrf-user/policies", {"policy": "FSReadAll"}),
        ("/admin/users/csrf-user/credentials", {}),
    ):
        for forged in ({}, {"csrf": "guessed"}):
            _error(admin.post(path, {**form, **forged}), 403, "CSRF_TOKEN_INVALID")
    with suite.client() as client:
        assert {"csrf-new-user"} & {u.id for u in client.iter_users()} == set()
        assert {"csrf-new-group"} & {g.id for g in client.iter_groups()} == set()
        assert "CsrfPolicy" not in [p.id for p in client.iter_policies()]
        assert list(client.iter_group_members("csrf-group")) == []
        assert list(client.iter_group_policies("csrf-group")) == []
        assert list(client.iter_user_policies("csrf-user")) == []
        assert len(list(client.iter_credentials("csrf-user"))) == keys


def test_bad_admin_forms_get_a_clear_error_page(admin):
    csrf = admin.get("/admin/users").csrf()
    _error(admin.post("/admin/users", {"csrf": csrf, "user_id": ""}), 400, "FORM_FIELD_MISSING")
    bad = admin.post("/admin/users", {"csrf": csrf, "user_id": "no spaces/allowed"})
    assert bad.status == 400 and 'id="error-code">INVALID_ARGUMENT<' in bad.text
    policy = admin.post(
        "/admin/policies", {"csrf": csrf, "policy_id": "Broken", "document": '{"Statement": [{'}
    )
    _error(policy, 400, "INVALID_POLICY")
    taken = admin.post("/admin/groups", {"csrf": csrf, "group_id": "Admins"})
    assert taken.status == 409 and 'id="error-code">ALREADY_EXISTS<' in taken.text
    missing = admin.post("/admin/groups/no-such-group/members", {"csrf": csrf, "user": "x"})
    assert missing.status == 404 and "Traceback" not in missing.text
    _error(
        admin.post("/admin/groups/Admins/members", {"csrf": csrf, "user": ""}),
        400,
        "FORM_FIELD_MISSING",
    )
    no_policy = admin.post("/admin/users/admin/policies", {"csrf": csrf, "policy": "NoSuch"})
    assert no_policy.status == 404 and 'id="error-code">NOT_FOUND<' in no_policy.text
    no_user = admin.post("/admin/users/no-such-user/credentials", {"csrf": csrf})
    assert no_user.status == 404 and 'id="error-code">NOT_FOUND<' in no_user.text
    assert admin.get("/admin/users/no-such-user").status == 404


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


def test_confirmation_pages_refuse_who_may_not_do_what_they_confirm(suite, viewer, admin):
    repo = _repo(suite, "confirm-rights")
    with suite.client() as client:
        client.create_tag(repo, "v1", "main")
        client.create_group("confirm-group")
        client.create_user("confirm-user")
    pages = [
        f"/repos/{repo}/delete",
        f"/repos/{repo}/tags/delete?tag=v1",
        "/admin/users/confirm-user/delete",
        "/admin/groups/confirm-group/delete",
        "/admin/policies/delete?policy=FSReadAll",
    ]
    for page in pages:
        refused = viewer.get(page)
        _error(refused, 403, "PERMISSION_DENIED")
        assert 'id="confirm-form"' not in refused.text and "Delete permanently" not in refused.text
        # An admin gets the form.
        assert admin.get(page).status == 200, page


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
    branches = viewer.get(f"/repos/{repo}/branches").text
    assert 'id="create-branch"' not in branches and "tag…" not in branches
    tags = viewer.get(f"/repos/{repo}/tags").text
    assert 'id="create-tag"' not in tags and "delete…" not in tags
    assert 'id="upload-form"' not in viewer.get(f"/repos/{repo}/objects").text
    assert viewer.get("/admin/users").status == 403  # ListUsers: the servers refuse


def test_a_forged_form_from_a_read_only_user_is_permission_denied(suite, viewer):
    """The console holds no privilege: a form the page never offered, posted with the
    user's own valid session and CSRF token, reaches the servers with the user's token and
    is refused there."""
    repo = _repo(suite, "forged")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "x.txt", b"x")
        head = client.get_branch(repo, "main").commit_id
        client.create_tag(repo, "kept", head)
    csrf = viewer.get("/repos").csrf()
    for path, form in (
        (f"/repos/{repo}/commit", {"branch": "main", "message": "forged"}),
        (f"/repos/{repo}/discard", {"branch": "main"}),
        (f"/repos/{repo}/delete", {"confirm": repo}),
        (f"/repos/{repo}/tags", {"name": "forged-tag", "ref": "main"}),
        (f"/repos/{repo}/tags/delete", {"tag": "kept", "confirm": "kept"}),
        ("/repos", {"name": "forged-new", "storage_namespace": suite.namespace("forged-new")}),
    ):
        refused = viewer.post(path, {"csrf": csrf, **form})
        assert refused.status == 403, (path, refused.text)
        assert 'id="error-code">PERMISSION_DENIED<' in refused.text
    with suite.client() as client:
        assert client.get_branch(repo, "main").commit_id == head
        assert [c.path for c in client.iter_uncommitted(repo, "main")] == ["x.txt"]
        assert "forged-new" not in [r.name for r in client.iter_repositories()]
        assert [t.name for t in client.iter_tags(repo)] == ["kept"]
    before = _files(suite, repo)
    upload = viewer.post_file(
        f"/repos/{repo}/upload", {"csrf": csrf, "branch": "main"}, "forged.txt", b"f" * 5000
    )
    _error(upload, 403, "PERMISSION_DENIED")
    assert _files(suite, repo) == before  # no byte of it is left in the namespace
    with suite.client() as client:
        admin_keys = len(list(client.iter_credentials("admin")))
    for path, form in (
        ("/admin/users", {"user_id": "forged-user"}),
        ("/admin/users/admin/credentials", {}),
        ("/admin/users/admin/delete", {"confirm": "admin"}),
        ("/admin/groups/Admins/members", {"user": "viewer-user"}),
        ("/admin/policies", {"policy_id": "Forged", "document": "{}"}),
        ("/admin/groups", {"group_id": "forged-group"}),
        ("/admin/users/viewer-user/policies", {"policy": "FSFullAccess"}),
        ("/admin/groups/Viewers/policies/detach", {"policy": "FSReadAll", "confirm": "FSReadAll"}),
        ("/admin/groups/Admins/members/remove", {"user": "admin", "confirm": "admin"}),
        ("/admin/groups/Viewers/delete", {"confirm": "Viewers"}),
        ("/admin/policies/delete", {"policy": "FSReadAll", "confirm": "FSReadAll"}),
    ):
        _error(viewer.post(path, {"csrf": csrf, **form}), 403, "PERMISSION_DENIED")
    with suite.client() as client:
        assert "forged-user" not in [u.id for u in client.iter_users()]
        assert "viewer-user" not in [u.id for u in client.iter_group_members("Admins")]
        assert "admin" in [u.id for u in client.iter_group_members("Admins")]
        assert "forged-group" not in [g.id for g in client.iter_groups()]
        assert list(client.iter_user_policies("viewer-user")) == []
        assert "FSReadAll" in [p.id for p in client.iter_group_policies("Viewers")]
        assert "FSReadAll" in [p.id for p in client.iter_policies()]
        assert len(list(client.iter_credentials("admin"))) == admin_keys
    with suite.client() as client:
        assert [c.path for c in client.iter_uncommitted(repo, "main")] == ["x.txt"]


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

    from quarry.ports import free_port
    from support.console import serving_console

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


# ---- what an attacker or a shared link sends -------------------------------------------------


def _sign_in_via(browser: Browser, link: str) -> Answer:
    """Follow `link` signed out, then sign in on the page it leads to: the final answer."""
    to_login = browser.get(link)
    assert to_login.status == 303
    page = browser.get(to_login.header("location"))
    fields = dict(re.findall(r'name="(next)" value="([^"]*)"', page.text))
    return browser.post(
        "/login",
        {
            "csrf": page.csrf(),
            "access_key_id": TEST_ACCESS_KEY_ID,
            "secret_access_key": TEST_SECRET_ACCESS_KEY,
            "next": html.unescape(fields.get("next", "")),
        },
    )


def test_a_shared_link_survives_sign_in_with_its_query(console):
    link = "/repos/shared-repo/object?ref=main&path=a%20b%2Fc.txt"
    signed = _sign_in_via(Browser(console[0]), link)
    assert signed.status == 303 and signed.header("location") == (
        "/repos/shared-repo/object?ref=main&path=a+b%2Fc.txt"
    )


def test_a_refused_sign_in_keeps_the_page_to_return_to(console):
    browser = Browser(console[0])
    page = browser.get("/login?next=%2Frepos%2Fkept%2Fobjects")
    refused = browser.post(
        "/login",
        {
            "csrf": page.csrf(),
            "access_key_id": TEST_ACCESS_KEY_ID,
            "secret_access_key": "wrong",
            "next": "/repos/kept/objects",
        },
    )
    assert refused.status == 401 and 'value="/repos/kept/objects"' in refused.text


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example",
        "/\\evil.example",
        "/\t/evil.example",
        "/\n/evil.example",
        "/x\r\nSet-Cookie: planted=1",
        "https://evil.example",
        "javascript:alert(1)",
        "/repos/日本",  # not ASCII: no header can carry it (it was a 500 after sign-in)
        "/\u0100",
    ],
)
def test_sign_in_never_redirects_off_site_or_splits_the_header(console, target):
    browser = Browser(console[0])
    page = browser.get("/login")
    signed = browser.post(
        "/login",
        {
            "csrf": page.csrf(),
            "access_key_id": TEST_ACCESS_KEY_ID,
            "secret_access_key": TEST_SECRET_ACCESS_KEY,
            "next": target,
        },
    )
    assert signed.status == 303 and signed.header("location") == "/repos"
    assert "planted" not in browser.cookies


def test_an_upload_is_shown_inline_only_as_a_raster_image(suite, admin):
    repo = _repo(suite, "inline")
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
    cases = {
        "real.png": ("image/png", png, "image/png", "inline"),
        "page.png": ("text/html", b"<h1>phish</h1>", "application/octet-stream", "attachment"),
        "vector.svg": ("IMAGE/SVG+XML", b"<svg/>", "image/svg+xml", "attachment"),
        "param.svg": ("image/svg+xml; charset=utf-8", b"<svg/>", "image/svg+xml", "attachment"),
        "typed.bin": ("image/png; x=1", png, "image/png", "inline"),
    }
    with suite.client() as client:
        for name, (stored, data, _, _) in cases.items():
            _stage(suite, client, repo, "main", name, data, content_type=stored)
    for name, (_, data, sent, disposition) in cases.items():
        got = admin.get(f"/repos/{repo}/download?ref=main&path={name}&inline=1")
        assert got.status == 200 and got.body == data
        assert got.header("content-type") == sent, name
        assert got.header("content-disposition").startswith(disposition), name


def test_a_content_type_with_a_line_break_is_refused_when_staged(suite):
    from quarry import errors

    repo = _repo(suite, "crlf-type")
    with suite.client() as client, pytest.raises(errors.QuarryError) as refused:
        _stage(suite, client, repo, "main", "x.txt", b"x", content_type="text/plain\r\nX: y")
    assert refused.value.code.name == "INVALID_ARGUMENT"
    with suite.client() as client:
        assert list(client.iter_objects(repo, "main")) == []


def test_an_unknown_merge_strategy_is_a_400(suite, admin):
    repo = _repo(suite, "strategies")
    with suite.client() as client:
        client.create_branch(repo, "feature", "main")
    _error(
        admin.get(f"/repos/{repo}/merge?source=feature&destination=main&strategy=bogus"),
        400,
        "INVALID_ARGUMENT",
    )
    form = admin.get(f"/repos/{repo}/merge?source=feature&destination=main")
    _error(
        admin.post(
            f"/repos/{repo}/merge",
            {"csrf": form.csrf(), "source": "feature", "destination": "main", "strategy": "x"},
        ),
        400,
        "INVALID_ARGUMENT",
    )


def test_the_console_process_trusts_no_forwarded_address_and_logs_paths_encoded(suite, tmp_path):
    """As users run it (`quarry serve console`): an X-Forwarded-For header, even from
    loopback, does not change the address the sign-in throttle counts; a %0A in a path
    does not start a line of its own in the text log."""
    from support.console import serving_console

    extra = {
        "QUARRY_CONSOLE_LOGIN_ATTEMPTS_PER_MINUTE_PER_ADDRESS": "2",
        "QUARRY_LOG_FORMAT": "text",
        "QUARRY_LOG_LEVEL": "INFO",
    }
    with serving_console(suite, tmp_path, extra) as port:
        attacker = Browser(port, source="127.0.0.1")
        for i in range(2):
            attacker.headers["x-forwarded-for"] = f"10.0.0.{i}"
            assert attacker.sign_in(TEST_ACCESS_KEY_ID, "a-guess").status == 401
        attacker.headers["x-forwarded-for"] = "10.0.0.99"
        assert attacker.sign_in(TEST_ACCESS_KEY_ID, "a-guess").status == 429
        assert Browser(port).get("/x%0Aquarry.audit%20forged").status in (303, 404)
    log = (tmp_path / "console.log").read_text()
    assert not any(line.startswith("quarry.audit forged") for line in log.splitlines())
    assert "/x%0Aquarry.audit%20forged" in log


def test_a_name_with_a_direction_override_is_shown_escaped(suite, admin):
    """ "photo\\u202egpj.exe" would display as "photoexe.jpg" in a browser."""
    repo = _repo(suite, "bidi")
    name = "photo\u202egpj.exe"
    with suite.client() as client:
        _stage(suite, client, repo, "main", name, b"x")
        client.commit(repo, "main", "a spoof", metadata={"k\u202e": "v"})
    for page in (
        f"/repos/{repo}/objects?ref=main",
        f"/repos/{repo}/object?ref=main&path=photo%E2%80%AEgpj.exe",
        f"/repos/{repo}/compare?left=main~1&right=main&mode=two",
    ):
        answer = admin.get(page)
        assert answer.status == 200, (page, answer.text[-500:])
        assert "\u202e" not in answer.text and "photo\\u202egpj.exe" in answer.text, page


def test_a_signed_in_users_calls_reach_only_the_configured_compactor_sensor(suite, admin):
    """The session's client once dialed the compactor-sensor's default port (7404), not
    the configured one, with the user's token: the branches page showed "n/a" and anything
    listening there got the token. The staging counts shown come from the suite's sensor."""
    repo = _repo(suite, "sensor")
    with suite.client() as client:
        _stage(suite, client, repo, "main", "a.txt", b"a")
        _stage(suite, client, repo, "main", "b.txt", b"b")
    deadline = time.monotonic() + 30
    page = admin.get(f"/repos/{repo}/branches")
    while "<td>2 / 0</td>" not in page.text and time.monotonic() < deadline:
        time.sleep(0.2)  # the sensor hears of staging from branch-manager's reports
        page = admin.get(f"/repos/{repo}/branches")
    assert "<td>2 / 0</td>" in page.text, page.text


def test_a_download_is_the_entrys_object_or_fails(suite, admin):
    """Checked as `quarry get` checks: an entry of unknown size (0, no checksum) downloads
    whole (it was an empty file); a local file of another size is an error page (502
    DATA_LOSS), never a download that breaks off; bytes changed in place (same size,
    SHA-256 recorded) end the download before its last bytes, never a saved file of them."""
    repo = _repo(suite, "checked-downloads")
    data = bytes(range(256)) * 12
    store = Path(suite.namespace(repo)) / "data"
    store.mkdir(parents=True, exist_ok=True)
    (store / "unknown").write_bytes(data)
    (store / "resized").write_bytes(data)
    (store / "altered").write_bytes(data)
    with suite.client() as client:
        client.put_object(repo, "main", path="unknown", physical_address=str(store / "unknown"))
        for name in ("resized", "altered"):
            client.put_object(
                repo,
                "main",
                path=name,
                physical_address=str(store / name),
                size_bytes=len(data),
                checksum=hashlib.sha256(data).hexdigest(),
            )
    (store / "resized").write_bytes(data + b"more")
    (store / "altered").write_bytes(bytes(reversed(data)))

    whole = admin.get(f"/repos/{repo}/download?ref=main&path=unknown")
    assert whole.status == 200 and whole.body == data
    assert whole.header("cache-control") == "no-store"
    resized = admin.get(f"/repos/{repo}/download?ref=main&path=resized")
    assert resized.status == 502 and "OBJECT_CHANGED" in resized.text
    # A small object is checked whole before the answer starts: an error page (a larger
    # one's download ends before its last chunk).
    altered = admin.get(f"/repos/{repo}/download?ref=main&path=altered")
    assert altered.status == 502 and "CHECKSUM_MISMATCH" in altered.text


def test_an_object_page_shows_the_entry_whatever_its_bytes_or_storage(suite, admin):
    """A valid Parquet file with a date Python cannot hold (past year 9999), one with
    damaged data pages, and an entry whose store cannot be reached: each page shows the
    entry and its Download link with a note, never an error page in its place."""
    import datetime

    repo = _repo(suite, "odd-previews")
    far = pa.table({"t": pa.array([253402300800], type=pa.timestamp("s"))})  # year 10000
    buffer = io.BytesIO()
    pq.write_table(far, buffer)
    sane = io.BytesIO()
    pq.write_table(pa.table({"d": [datetime.date(2024, 1, 1)] * 50}), sane, compression="snappy")
    damaged = bytearray(sane.getvalue())
    damaged[4:60] = b"\xff" * 56  # the first data page's header, the footer intact
    with suite.client() as client:
        _stage(suite, client, repo, "main", "far.parquet", buffer.getvalue())
        _stage(suite, client, repo, "main", "damaged.parquet", bytes(damaged))
        client.put_object(
            repo,
            "main",
            path="elsewhere.txt",
            physical_address="s3://no-such-bucket-anywhere/x.txt",
            size_bytes=3,
            checksum="c",
        )
    for path in ("far.parquet", "damaged.parquet", "elsewhere.txt"):
        page = admin.get(f"/repos/{repo}/object?ref=main&path={path}")
        assert page.status == 200, (path, page.text)
        assert f"/repos/{repo}/download?" in page.text and 'class="note"' in page.text, path
    assert (
        'id="parquet-schema"' in admin.get(f"/repos/{repo}/object?ref=main&path=far.parquet").text
    )


@pytest.mark.parametrize("token", ["日本", "é", "x" * 5000])
def test_a_forged_csrf_token_of_any_characters_is_refused_not_an_error(console, admin, token):
    browser = Browser(console[0])
    browser.get("/login")
    refused = browser.post(
        "/login",
        {
            "csrf": token,
            "access_key_id": TEST_ACCESS_KEY_ID,
            "secret_access_key": TEST_SECRET_ACCESS_KEY,
        },
    )
    assert refused.status == 403 and sessions.SESSION_COOKIE not in browser.cookies
    assert admin.post("/logout", {"csrf": token}).status == 403


def test_small_navigation_cases_of_a_repository_whose_default_branch_is_not_main(suite, admin):
    """A branch made with an empty From starts at the repository's default branch (it was
    `main`); the Uncommitted tab followed from a tag shows the default branch's changes
    (it was a NOT_A_BRANCH page); a folder marker object (`dir/`) is a row with a name."""
    with suite.client() as client:
        client.create_repository("trunked", suite.namespace("trunked"), default_branch="trunk")
        _stage(suite, client, "trunked", "trunk", "dir/", b"")
        _stage(suite, client, "trunked", "trunk", "dir/a.txt", b"a")
        client.commit("trunked", "trunk", "first")
        client.create_tag("trunked", "v1", "trunk")
    page = admin.get("/repos/trunked/branches")
    made = admin.post(
        "/repos/trunked/branches", {"csrf": page.csrf(), "name": "side", "source": ""}
    )
    assert made.status == 303, made.text
    with suite.client() as client:
        side = client.get_branch("trunked", "side")
        assert side.commit_id == client.get_branch("trunked", "trunk").commit_id
    tab = admin.get("/repos/trunked/changes?branch=v1")
    assert tab.status == 303 and tab.header("location") == "/repos/trunked/changes?branch=trunk"
    folder = admin.get("/repos/trunked/objects?ref=trunk&prefix=dir%2F")
    assert re.search(r'<a href="[^"]*path=dir%2F">\./</a>', folder.text), folder.text


def test_the_branches_page_asks_a_sensor_that_is_down_once(suite, admin, monkeypatch):
    """Each row's staging counts come from the compactor-sensor: one quick attempt, and
    none after a failure (a page of 50 branches waited out 50 calls' retries, minutes)."""
    from quarry import errors
    from quarry.client import Client

    repo = _repo(suite, "sensor-down")
    with suite.client() as client:
        for i in range(4):
            client.create_branch(repo, f"b{i}", "main")
    asked = []

    def down(self, repository, branch, *, quick=False):
        asked.append(quick)
        raise errors.Unavailable("the sensor is down")

    monkeypatch.setattr(Client, "branch_staging_stats", down)
    page = admin.get(f"/repos/{repo}/branches")
    assert page.status == 200 and page.text.count("n/a") >= 5
    assert asked == [True]
