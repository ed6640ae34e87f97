"""The web console in a real browser: headless Chromium (Debian's chromium and
chromium-driver, `make test-clients`) driven by Selenium against a real `quarry up` started
as a user starts it (its own QUARRY_HOME, free ports). One walk through a data change —
sign in, create a repository and a branch, stage with the CLI, commit in the console, compare,
merge with a conflict the dry run shows, resolve, merge — then a read-only user, a forged
form, a CSRF-less post and a planted session id; then an upload through the object browser,
committed and tagged, the tag deleted after confirming, and an admin creating a user and
credentials. A screenshot of each page is written to
build/artifacts/console/ (the test's artifacts)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from quarry.cli.main import SERVICE_MODULES
from quarry.client import Client
from support.auth import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY
from support.processes import REPO_ROOT, VENV_BIN, free_port, quarry_env, service_ports

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (shutil.which("chromium") and shutil.which("chromedriver")),
        reason="no chromium/chromedriver: `make test-clients` installs Debian's",
    ),
]

ARTIFACTS = REPO_ROOT / "build" / "artifacts" / "console"


class Up:
    def __init__(self, home: Path) -> None:
        self.ports = {name: free_port() for name in SERVICE_MODULES}
        self.env = quarry_env(
            home,
            **service_ports(self.ports),
        )
        self.home = home
        self.child: subprocess.Popen | None = None
        self.banner = ""

    def start(self) -> None:
        self.child = subprocess.Popen(
            [str(VENV_BIN / "quarry"), "up"],
            env=self.env,
            cwd=self.home.parent,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        lines = []
        for line in self.child.stdout:
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        self.banner = "".join(lines)
        assert "Press Ctrl-C" in self.banner, self.banner
        # Keep its output drained (a full pipe would block the services' forwarder).
        import threading

        threading.Thread(target=self.child.stdout.read, daemon=True).start()

    def stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
            try:
                self.child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()

    @property
    def console(self) -> str:
        return f"http://127.0.0.1:{self.ports['console']}"

    def cli(self, *args: str) -> str:
        ran = subprocess.run(
            [str(VENV_BIN / "quarry"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, (args, ran.stdout, ran.stderr)
        return ran.stdout

    def client(self) -> Client:
        return Client(
            f"127.0.0.1:{self.ports['branch-manager']}",
            f"127.0.0.1:{self.ports['committer']}",
        )


@pytest.fixture(scope="module")
def up(tmp_path_factory) -> Iterator[Up]:
    running = Up(tmp_path_factory.mktemp("console-up") / "home")
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def driver():
    os.environ.setdefault("SE_OFFLINE", "true")  # never download a browser or a driver
    os.environ.setdefault("SE_AVOID_STATS", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(argument)
    browser = webdriver.Chrome(
        service=Service(executable_path=shutil.which("chromedriver")), options=options
    )
    browser.set_page_load_timeout(60)
    # A click that submits a form returns before the next page has loaded: `follow` waits
    # until the old page is gone, and element lookups wait (up to 30 s on a loaded machine)
    # for the new page's elements.
    browser.implicitly_wait(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield browser
    finally:
        browser.quit()


def shot(driver, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def present(driver, element_id: str) -> bool:
    from selenium.webdriver.common.by import By

    driver.implicitly_wait(0)  # an absent control is checked on the loaded page, at once
    try:
        return bool(driver.find_elements(By.ID, element_id))
    finally:
        driver.implicitly_wait(30)


def page_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "main").text


def follow(driver, action) -> None:
    """Do what leaves the page (a click or submit that posts a form or follows a link) and wait
    until the next page has loaded: the click returns before it has, and a check made at once
    can read the old page (or find its elements gone: stale). The old page is marked; the wait
    ends when the window holds an unmarked, loaded document. While the browser swaps documents
    a script call can fail transiently: the wait retries it."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_script("window.quarryOldPage = true")
    action()
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return window.quarryOldPage === undefined && document.readyState === 'complete'"
        )
    )


def sign_in(driver, up: Up, key_id: str, secret: str) -> None:
    driver.get(f"{up.console}/login")
    by_id(driver, "access_key_id").send_keys(key_id)
    by_id(driver, "secret_access_key").send_keys(secret)
    follow(driver, by_id(driver, "sign-in").click)


def wait_for_url(driver, part: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: part in d.current_url)


def sign_out(driver) -> None:
    follow(driver, by_id(driver, "sign-out").click)
    wait_for_url(driver, "/login")


def test_a_data_change_from_sign_in_to_merge(up, driver, tmp_path):
    from selenium.webdriver.support.ui import Select

    assert f"the console: {up.console}/" in up.banner
    driver.get(f"{up.console}/repos")  # not signed in: the sign-in page
    assert "/login" in driver.current_url
    shot(driver, "01-sign-in")
    sign_in(driver, up, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
    assert by_id(driver, "whoami").text == "admin"
    shot(driver, "02-repositories")

    namespace = tmp_path / "lake"
    namespace.mkdir()
    by_id(driver, "repo-name").send_keys("web")
    by_id(driver, "repo-namespace").send_keys(str(namespace))
    follow(driver, by_id(driver, "create-repository").submit)
    assert driver.current_url.endswith("/repos/web/objects")

    driver.get(f"{up.console}/repos/web/branches")
    by_id(driver, "branch-name").send_keys("feature")
    follow(driver, by_id(driver, "create-branch").submit)
    assert "ref=feature" in driver.current_url

    data = tmp_path / "data"
    data.mkdir()
    (data / "people.csv").write_text("id,name\n1,ada\n")
    up.cli("put", "web", "main", "tables/people.csv", "--from", str(data / "people.csv"))
    # Commit in the console.
    driver.get(f"{up.console}/repos/web/changes?branch=main")
    assert "tables/people.csv" in by_id(driver, "changes").text
    shot(driver, "03-uncommitted")
    by_id(driver, "commit-message-input").send_keys("people from the console")
    follow(driver, by_id(driver, "commit-button").click)
    assert "people from the console" in by_id(driver, "commit-message").text
    shot(driver, "04-commit")

    # feature was made before that commit: bring it along, then both branches change the
    # same file (a conflict).
    with up.client() as client:
        client.merge("web", "main", "feature")
    (data / "people.csv").write_text("id,name\n1,ada\n2,grace\n")
    up.cli("put", "web", "feature", "tables/people.csv", "--from", str(data / "people.csv"))
    (data / "new.txt").write_text("only on feature\n")
    up.cli("put", "web", "feature", "notes/new.txt", "--from", str(data / "new.txt"))
    up.cli("commit", "web", "feature", "-m", "feature work")
    (data / "people.csv").write_text("id,name\n1,ada lovelace\n")
    up.cli("put", "web", "main", "tables/people.csv", "--from", str(data / "people.csv"))
    up.cli("commit", "web", "main", "-m", "main work")

    driver.get(f"{up.console}/repos/web/compare?left=main&right=feature&mode=two")
    counts = by_id(driver, "compare-counts").text
    assert "1 added" in counts and "1 changed" in counts, counts
    shot(driver, "05-compare")

    driver.get(f"{up.console}/repos/web/merge")
    by_id(driver, "merge-source").send_keys("feature")
    by_id(driver, "merge-destination").send_keys("main")
    follow(driver, by_id(driver, "dry-run").click)
    assert "MERGE_CONFLICT" in by_id(driver, "merge-conflicts-summary").text
    assert "tables/people.csv" in by_id(driver, "conflicts").text
    assert not present(driver, "merge-button")
    shot(driver, "06-merge-conflict")

    # Resolve in the console: choose to keep the source's side of each conflict; the dry run
    # is clean now, and the merge goes through.
    Select(by_id(driver, "merge-strategy")).select_by_value("source-wins")
    follow(driver, by_id(driver, "dry-run").click)
    assert "No conflicts" in by_id(driver, "merge-summary").text, page_text(driver)
    shot(driver, "07-merge-clean")
    follow(driver, by_id(driver, "merge-button").click)
    assert "/repos/web/commits/" in driver.current_url, page_text(driver)
    driver.get(f"{up.console}/repos/web/log?ref=main")
    assert driver.find_element("css selector", "svg.graph")
    assert "merge" in by_id(driver, "log").text
    shot(driver, "08-log-graph")
    with up.client() as client:
        merged = client.get_commit("web", "main")
        assert len(merged.parents) == 2

    driver.get(f"{up.console}/repos/web/objects?ref=main")
    shot(driver, "09-objects")
    driver.get(f"{up.console}/repos/web/object?ref=main&path=tables%2Fpeople.csv")
    assert "grace" in by_id(driver, "preview-text").text  # feature's side, merged
    shot(driver, "10-object")
    sign_out(driver)
    assert "/login" in driver.current_url


def test_a_read_only_user_sees_no_write_controls_and_a_forged_form_is_refused(up, driver):
    with up.client() as client:
        client.create_repository("read-only", str(up.home / "lake-ro"))
        client.create_user("reader")
        client.add_group_member("Viewers", "reader")
        made = client.create_credentials("reader")
        head = client.get_branch("read-only", "main").commit_id
    sign_in(driver, up, made.credentials.access_key_id, made.secret_access_key)
    assert by_id(driver, "whoami").text == "reader"
    assert not present(driver, "create-repository")
    driver.get(f"{up.console}/repos/read-only/branches")
    assert not present(driver, "create-branch")
    shot(driver, "11-read-only")
    # A form the page never offered, posted with the reader's own session and CSRF token.
    follow(
        driver,
        lambda: driver.execute_script(
            """
            const csrf = document.querySelector('input[name=csrf]').value;
            const form = document.createElement('form');
            form.method = 'post'; form.action = '/repos/read-only/commit';
            for (const [k, v] of [['csrf', csrf], ['branch', 'main'], ['message', 'forged']]) {
                const input = document.createElement('input');
                input.type = 'hidden'; input.name = k; input.value = v; form.appendChild(input);
            }
            document.body.appendChild(form); form.submit();
            """
        ),
    )
    assert by_id(driver, "error-code").text == "PERMISSION_DENIED"
    shot(driver, "12-permission-denied")
    with up.client() as client:
        assert client.get_branch("read-only", "main").commit_id == head
    driver.get(f"{up.console}/repos")
    sign_out(driver)


def test_a_user_who_may_write_only_a_prefix_uploads_through_the_console(up):
    """The console stages an upload as the signed-in user, with its own service token as
    the relay of the bytes it wrote: a user who may not read every object of the repository
    never stages an address inside its namespace without it (quarry.auth.checks), and still
    uploads through the console of a real `quarry up` (HTTP, no browser needed)."""
    from support.console import Browser

    with up.client() as client:
        client.create_repository("prefix-upload", str(up.home / "lake-prefix"))
        client.create_user("prefix-writer")
        client.add_group_member("Viewers", "prefix-writer")
        statement = {
            "Effect": "Allow",
            "Action": ["fs:WriteObject"],
            "Resource": "arn:quarry:fs:::repository/prefix-upload/object/up/*",
        }
        client.create_policy("prefix-writer", json.dumps({"Statement": [statement]}))
        client.attach_policy("prefix-writer", user="prefix-writer")
        client.create_policy(
            "prefix-no-vault",
            json.dumps(
                {
                    "Statement": [
                        {
                            "Effect": "Deny",
                            "Action": ["fs:ReadObject"],
                            "Resource": "arn:quarry:fs:::repository/prefix-upload/object/vault/*",
                        }
                    ]
                }
            ),
        )
        client.attach_policy("prefix-no-vault", user="prefix-writer")
        made = client.create_credentials("prefix-writer")
    browser = Browser(up.ports["console"])
    assert browser.sign_in(made.credentials.access_key_id, made.secret_access_key).status == 303
    page = browser.get("/repos/prefix-upload/objects?ref=main&prefix=up%2F")
    data = b"uploaded by a prefix writer\n" * 100
    answer = browser.post_file(
        "/repos/prefix-upload/upload",
        {"csrf": page.csrf(), "branch": "main", "path": "up/"},
        "mine.txt",
        data,
    )
    assert answer.status == 303, answer.text[-600:]
    with up.client() as client:
        assert client.stat_object("prefix-upload", "main", "up/mine.txt").size_bytes == len(data)


def test_a_csrf_less_post_and_a_planted_session_are_refused(up, driver):
    # Session fixation: a session id planted before sign-in is replaced at sign-in.
    driver.get(f"{up.console}/login")
    driver.add_cookie({"name": "quarry_console_session", "value": "planted-by-attacker"})
    sign_in(driver, up, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
    issued = driver.get_cookie("quarry_console_session")
    assert issued["value"] != "planted-by-attacker" and issued["httpOnly"]
    assert issued["sameSite"] == "Strict"
    # A post without the session's CSRF token (as a page of another site would send it).
    follow(
        driver,
        lambda: driver.execute_script(
            """
            const form = document.createElement('form');
            form.method = 'post'; form.action = '/repos';
            const input = document.createElement('input');
            input.name = 'name'; input.value = 'csrf-attack'; form.appendChild(input);
            document.body.appendChild(form); form.submit();
            """
        ),
    )
    assert by_id(driver, "error-reason").text == "CSRF_TOKEN_INVALID"
    shot(driver, "13-csrf-refused")
    with up.client() as client:
        assert "csrf-attack" not in [r.name for r in client.iter_repositories()]


def wait_for_url_end(driver, end: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: d.current_url.endswith(end))


def test_upload_commit_tag_and_admin_edits(up, driver, tmp_path):
    """Upload through the object browser (the file input given a local file's path, as a
    user picks one), commit it, tag it and delete the tag after confirming; an admin creates
    a user and credentials that then sign in."""
    with up.client() as client:
        client.create_repository("uploads", str(up.home / "lake-uploads"))
    sign_in(driver, up, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY)
    assert by_id(driver, "whoami").text == "admin"

    local = tmp_path / "measurements.csv"
    local.write_text("day,value\n1,42\n")
    driver.get(f"{up.console}/repos/uploads/objects?ref=main&prefix=raw%2F")
    assert by_id(driver, "upload-path").get_attribute("value") == "raw/"
    by_id(driver, "upload-file").send_keys(str(local))
    shot(driver, "14-upload")
    follow(driver, by_id(driver, "upload-button").click)
    wait_for_url(driver, "/changes")
    assert "raw/measurements.csv" in by_id(driver, "changes").text, page_text(driver)
    shot(driver, "15-uploaded-uncommitted")
    by_id(driver, "commit-message-input").send_keys("measurements uploaded in the console")
    follow(driver, by_id(driver, "commit-button").click)
    assert "measurements uploaded" in by_id(driver, "commit-message").text
    with up.client() as client:
        head = client.get_branch("uploads", "main").commit_id
        entry = client.stat_object("uploads", "main", "raw/measurements.csv")
        assert entry.size_bytes == local.stat().st_size

    # Tag the branch from its row on the branches page, then delete the tag.
    driver.get(f"{up.console}/repos/uploads/branches")
    follow(driver, driver.find_element("css selector", "a.tag-branch").click)
    assert by_id(driver, "tag-ref").get_attribute("value") == "main"
    by_id(driver, "tag-name").send_keys("v1")
    follow(driver, by_id(driver, "create-tag-button").click)
    wait_for_url_end(driver, "/repos/uploads/tags")
    assert "v1" in by_id(driver, "tags").text
    shot(driver, "16-tag")
    with up.client() as client:
        assert client.get_tag("uploads", "v1").commit_id == head
    follow(driver, driver.find_element("css selector", "a.delete-tag").click)
    assert "v1" in by_id(driver, "confirm-detail").text or "v1" in page_text(driver)
    shot(driver, "17-confirm-delete-tag")
    follow(driver, by_id(driver, "confirm-button").click)
    wait_for_url_end(driver, "/repos/uploads/tags")
    assert "No tags." in by_id(driver, "tags").text
    with up.client() as client:
        assert list(client.iter_tags("uploads")) == []

    # An admin creates a user and credentials; the secret is shown once and signs in.
    driver.get(f"{up.console}/admin/users")
    by_id(driver, "new-user-id").send_keys("carol")
    follow(driver, by_id(driver, "create-user-button").click)
    wait_for_url_end(driver, "/admin/users/carol")
    follow(driver, by_id(driver, "create-credentials-button").click)
    key_id = by_id(driver, "new-access-key-id").text
    secret = by_id(driver, "new-secret-access-key").text
    assert key_id and secret
    shot(driver, "18-new-credentials")
    driver.get(f"{up.console}/admin/users/carol")
    assert key_id in by_id(driver, "user-credentials").text
    assert secret not in driver.page_source  # shown that once only
    shot(driver, "19-admin-user")
    sign_out(driver)
    sign_in(driver, up, key_id, secret)
    assert by_id(driver, "whoami").text == "carol"
    sign_out(driver)
