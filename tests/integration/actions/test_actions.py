"""Actions end to end: the real suite on loopback (gRPC), a real HTTP hook server in this
process (http.server on port 0), action files committed/staged like any object."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from quarry import errors
from quarry.actions import files, webhook
from quarry.actions.runs import RUNS_PREFIX, SECRET_KEY, Run
from quarry.graveler.refs import RefManager
from support.suite import suite_fixture


class HookServer:
    """Answers by path: /ok 200, /fail 400, /500 500, /slow waits for `release` first."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        calls = self.calls
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                url = urllib.parse.urlsplit(self.path)
                calls.append(
                    {
                        "path": url.path,
                        "query": dict(urllib.parse.parse_qsl(url.query)),
                        "signature": self.headers.get(webhook.SIGNATURE_HEADER),
                        "raw": body,
                        "body": json.loads(body),
                    }
                )
                status = {"/ok": 200, "/fail": 400, "/500": 500}.get(url.path, 200)
                if url.path == "/slow":
                    server.entered.set()
                    server.release.wait(30)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"answer from " + url.path.encode())

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [c["body"]["event_type"] for c in self.calls]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


suite = suite_fixture()


@pytest.fixture
def hooks():
    server = HookServer()
    yield server
    server.close()


@pytest.fixture
def client(suite):
    with suite.client() as client:
        yield client


_repos = iter(range(10**6))


@pytest.fixture
def repo(suite, client):
    name = f"act{next(_repos)}"
    client.create_repository(name, suite.namespace(name))
    return name


def put_file(suite, client, repo: str, branch: str, path: str, data: bytes) -> None:
    local = (
        Path(suite.namespace(repo)) / "objects" / hashlib.sha256(path.encode() + data).hexdigest()
    )
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    client.put_object(
        repo,
        branch,
        path=path,
        physical_address=str(local),
        size_bytes=len(data),
        checksum=hashlib.md5(data).hexdigest(),
    )


def action(
    url: str, events: str, name: str = "gate", timeout: str = "", hook: str = "check"
) -> bytes:
    timeout_line = f"\n      timeout: {timeout}" if timeout else ""
    return f"""name: {name}
on:
{events}
hooks:
  - id: {hook}
    type: webhook
    description: a test hook
    properties:
      url: {url}{timeout_line}
      query_params:
        team: data
""".encode()


def staged_paths(client, repo: str, branch: str) -> set[str]:
    return {c.path for c in client.iter_uncommitted(repo, branch)}


def head(client, repo: str, branch: str) -> str:
    return client.get_branch(repo, branch).commit_id


def runs(suite, repo: str) -> list[Run]:
    partition = RefManager(suite.backend).get_repository(repo).partition
    return [
        Run.from_json(kv.value)
        for kv in suite.backend.scan(partition, RUNS_PREFIX, RUNS_PREFIX[:-1] + b"0")
    ]


# ---- commit ------------------------------------------------------------------------------


def test_pre_and_post_commit_fire_with_the_documented_payload_signed(suite, client, repo, hooks):
    events = "  pre-commit:\n    branches: [main]\n  post-commit:\n"
    put_file(
        suite, client, repo, "main", "_quarry_actions/gate.yaml", action(hooks.url + "/ok", events)
    )
    put_file(suite, client, repo, "main", "data/a.parquet", b"PAR1")
    commit = client.commit(repo, "main", "add a", metadata={"k": "v"}).commit
    assert hooks.events() == ["pre-commit", "post-commit"]
    pre, post = (c["body"] for c in hooks.calls)
    for body in (pre, post):
        assert body["repository_id"] == repo
        assert body["branch_id"] == "main"
        assert body["source_ref"] == "main"
        assert body["action_name"] == "gate"
        assert body["hook_id"] == "check"
        assert body["commit_message"] == "add a"
        assert body["metadata"] == {"k": "v"}
        assert body["committer"]
        assert body["event_time"].endswith("Z")
    assert pre["commit_id"] == ""
    assert post["commit_id"] == commit.id
    assert hooks.calls[0]["query"] == {"team": "data"}
    # The HMAC verifies with the repository's secret (one per repository, in KV).
    partition = RefManager(suite.backend).get_repository(repo).partition
    secret = suite.backend.get(partition, SECRET_KEY).value
    for call in hooks.calls:
        assert webhook.verify(secret, call["raw"], call["signature"])
        # As a receiver reads it from its environment: a str (it raised TypeError).
        assert webhook.verify(secret.decode(), call["raw"], call["signature"])
        assert not webhook.verify(b"another secret", call["raw"], call["signature"])
    recorded = runs(suite, repo)
    assert sorted(r.event_type for r in recorded) == ["post-commit", "pre-commit"]
    assert all(r.status == "passed" for r in recorded)
    assert all(r.hooks[0].http_status == 200 for r in recorded)
    assert all(r.hooks[0].output == "answer from /ok" for r in recorded)


@pytest.mark.parametrize(
    ("path", "timeout", "expected"),
    [
        ("/fail", "", "HTTP 400"),
        ("/500", "", "HTTP 500"),
        ("/slow", "0.3s", "timed out"),
        ("unreachable", "", "unreachable"),
    ],
)
def test_a_failing_pre_commit_hook_aborts_and_changes_nothing(
    suite, client, repo, hooks, path, timeout, expected
):
    url = "http://127.0.0.1:9/" if path == "unreachable" else hooks.url + path
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(url, "  pre-commit:\n", timeout=timeout),
    )
    put_file(suite, client, repo, "main", "data/a.parquet", b"PAR1")
    before = head(client, repo, "main")
    staged = staged_paths(client, repo, "main")
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.commit(repo, "main", "add a")
    hooks.release.set()
    assert failed.value.reason == "HOOK_FAILED"
    assert "'gate'" in failed.value.message and "'check'" in failed.value.message
    assert expected in failed.value.message
    run_id = failed.value.metadata["run_id"]
    assert run_id in failed.value.message
    assert head(client, repo, "main") == before
    assert (
        staged_paths(client, repo, "main")
        == staged
        == {"_quarry_actions/gate.yaml", "data/a.parquet"}
    )
    (recorded,) = runs(suite, repo)
    assert recorded.run_id == run_id and recorded.status == "failed"


def test_a_write_during_a_slow_pre_commit_hook_stays_staged_and_is_not_lost(
    suite, client, repo, hooks
):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/slow", "  pre-commit:\n"),
    )
    put_file(suite, client, repo, "main", "data/seen.parquet", b"PAR1")
    result: dict = {}
    committing = threading.Thread(
        target=lambda: result.setdefault("r", client.commit(repo, "main", "seen"))
    )
    committing.start()
    assert hooks.entered.wait(30)
    put_file(suite, client, repo, "main", "data/late.parquet", b"PAR1late")
    hooks.release.set()
    committing.join(30)
    commit = result["r"].commit
    committed = {e.path for e in client.iter_objects(repo, commit.id)}
    assert committed == {"_quarry_actions/gate.yaml", "data/seen.parquet"}
    assert staged_paths(client, repo, "main") == {"data/late.parquet"}
    assert client.stat_object(repo, "main", "data/late.parquet").size_bytes == len(b"PAR1late")


def test_post_commit_failure_leaves_the_commit_done_and_the_run_recorded(
    suite, client, repo, hooks
):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/after.yaml",
        action(hooks.url + "/500", "  post-commit:\n"),
    )
    commit = client.commit(repo, "main", "with a post hook").commit
    assert head(client, repo, "main") == commit.id
    (recorded,) = runs(suite, repo)
    assert recorded.event_type == "post-commit" and recorded.status == "failed"
    assert recorded.commit_id == commit.id and recorded.hooks[0].http_status == 500


def test_branch_globs_choose_the_actions(suite, client, repo, hooks):
    events = "  pre-commit:\n    branches: ['release-*']\n"
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/fail", events),
    )
    client.commit(repo, "main", "not a release branch: the hook does not run")
    client.create_branch(repo, "release-1", "main")
    put_file(suite, client, repo, "release-1", "x", b"x")
    with pytest.raises(errors.FailedPrecondition, match="HTTP 400"):
        client.commit(repo, "release-1", "a release branch: the hook runs and refuses")
    assert hooks.events() == ["pre-commit"]


def test_an_invalid_action_file_fails_the_commit_naming_file_and_line(suite, client, repo, hooks):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_lakefs_actions/broken.yaml",
        b"name: x\non:\n  pre-commit:\nhooks: [\n",
    )
    before = head(client, repo, "main")
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.commit(repo, "main", "x")
    assert failed.value.reason == "INVALID_ACTION_FILE"
    assert "_lakefs_actions/broken.yaml:" in failed.value.message
    assert head(client, repo, "main") == before


def test_a_hook_url_to_the_metadata_address_is_refused(suite, client, repo, hooks):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action("http://169.254.169.254/latest/meta-data/", "  pre-commit:\n"),
    )
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.commit(repo, "main", "x")
    assert failed.value.reason == "HOOK_FAILED"
    assert "link-local/metadata" in failed.value.message


# ---- merge -------------------------------------------------------------------------------


def test_pre_merge_refuses_then_accepts_and_post_merge_fires(suite, client, repo, hooks):
    client.create_branch(repo, "feature", "main")
    events = "  pre-merge:\n    branches: [main]\n  post-merge:\n"
    put_file(
        suite,
        client,
        repo,
        "feature",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/fail", events),
    )
    client.commit(repo, "feature", "a gate that refuses")
    before = head(client, repo, "main")
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.merge(repo, "feature", "main")
    assert failed.value.reason == "HOOK_FAILED"
    assert head(client, repo, "main") == before
    put_file(
        suite,
        client,
        repo,
        "feature",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/ok", events),
    )
    client.commit(repo, "feature", "a gate that accepts")
    merged = client.merge(repo, "feature", "main").commit
    assert head(client, repo, "main") == merged.id
    assert hooks.events() == ["pre-merge", "pre-merge", "post-merge"]
    body = hooks.calls[-1]["body"]
    assert body["branch_id"] == "main" and body["source_ref"] == "feature"
    assert body["commit_id"] == merged.id


# ---- the guard, unit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1]/",
    ],
)
def test_link_local_and_metadata_urls_are_refused_whatever_the_allow_list(url):
    with pytest.raises(webhook.HookURLRefused):
        webhook.check_url(url, ())


def test_the_allow_list_limits_hosts():
    with pytest.raises(webhook.HookURLRefused, match="not in the allowed hosts"):
        webhook.check_url("http://example.com/", ("loopback",))
    webhook.check_url("http://127.0.0.1:9/", ("loopback",))
    webhook.check_url("http://localhost:9/", ("loopback",))


def test_literal_secrets_in_an_action_file_are_refused():
    doc = b"name: x\non:\n  pre-commit:\nhooks:\n  - id: h\n    type: webhook\n    properties:\n      url: http://127.0.0.1/\n      headers:\n        Authorization: Bearer abc\n"
    with pytest.raises(files.InvalidActionFile, match="environment references"):
        files.parse("_quarry_actions/x.yaml", doc)
    ok = doc.replace(b"Bearer abc", b"'{{ ENV.QUARRYACTION_HOOK_TOKEN }}'")
    assert files.parse("_quarry_actions/x.yaml", ok).hooks[0].properties["headers"]


def test_grpc_status_of_a_hook_failure_is_failed_precondition(suite, client, repo, hooks):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/fail", "  pre-commit:\n"),
    )
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.commit(repo, "main", "x")
    assert failed.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_hostname_resolving_to_a_metadata_address_is_refused(monkeypatch):
    """An attacker's DNS name answering one good and one metadata address gets nothing."""

    def resolve(host, port, *args, **kwargs):
        return [
            (2, 1, 6, "", ("127.0.0.1", port)),
            (2, 1, 6, "", ("169.254.169.254", port)),
        ]

    monkeypatch.setattr(webhook.socket, "getaddrinfo", resolve)
    with pytest.raises(webhook.HookURLRefused, match="link-local/metadata"):
        webhook.check_url("http://hooks.example.com/", ())


# ---- runs over gRPC and the CLI ----------------------------------------------------------


def test_runs_are_listed_and_shown_over_grpc_and_the_cli(suite, client, repo, hooks, capsys):
    from quarry.cli.main import main

    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/ok", "  post-commit:\n"),
    )
    commit = client.commit(repo, "main", "one").commit
    client.create_branch(repo, "dev", "main")
    put_file(suite, client, repo, "dev", "x", b"x")
    client.commit(repo, "dev", "two")
    listed = client.list_action_runs(repo).runs
    assert [r.branch for r in listed] == ["dev", "main"]  # newest first
    (on_commit,) = client.list_action_runs(repo, commit_id=commit.id).runs
    assert client.list_action_runs(repo, branch="main").runs == [on_commit]
    first = client.list_action_runs(repo, page_size=1)
    assert len(first.runs) == 1 and first.next_page_token
    second = client.list_action_runs(repo, page_size=1, page_token=first.next_page_token)
    assert [r.run_id for r in second.runs] == [on_commit.run_id]
    run = client.get_action_run(repo, on_commit.run_id)
    assert run.hooks[0].http_status == 200 and run.hooks[0].output == "answer from /ok"
    with pytest.raises(errors.NotFound):
        client.get_action_run(repo, "nope")
    targets = [
        "--branch-manager",
        suite.targets["branch-manager"],
        "--committer",
        suite.targets["committer"],
    ]
    assert main(["actions", "runs", "list", repo, "--commit", commit.id, *targets]) == 0
    out = capsys.readouterr().out
    assert on_commit.run_id in out and "post-commit" in out
    # Commit ids as everywhere in the CLI: 12 characters, whole with --full.
    assert f" {commit.id[:12]}\n" in out and commit.id[:13] not in out
    assert main(["actions", "runs", "list", repo, "--commit", commit.id, "--full", *targets]) == 0
    assert commit.id in capsys.readouterr().out
    # The short id the CLI prints (or any ref) names the commit too; it listed nothing.
    assert main(["actions", "runs", "list", repo, "--commit", commit.id[:12], *targets]) == 0
    assert on_commit.run_id in capsys.readouterr().out
    assert main(["actions", "runs", "show", repo, on_commit.run_id, *targets]) == 0
    out = capsys.readouterr().out
    assert "answer from /ok" in out and "passed" in out
    # --json: a hook's duration in seconds (a number), as the text shows it.
    assert main(["actions", "runs", "show", repo, on_commit.run_id, "--json", *targets]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["commit_id"] == commit.id
    assert all(isinstance(h["duration"], float) and h["duration"] >= 0 for h in shown["hooks"])


# ---- observability -------------------------------------------------------------------------


def test_every_hook_call_is_a_span_of_the_commit_and_counted(suite, client, repo, hooks):
    from prometheus_client import generate_latest

    from quarry import telemetry
    from quarry.actions.runs import METRICS
    from quarry.telemetry.metrics import expose

    expose(*METRICS)
    exporter = telemetry.use_in_memory_exporter()
    events = "  pre-commit:\n  post-commit:\n"
    put_file(
        suite, client, repo, "main", "_quarry_actions/gate.yaml", action(hooks.url + "/ok", events)
    )
    exporter.clear()
    with telemetry.tracer("test").start_as_current_span("user") as user:
        client.commit(repo, "main", "traced")
    trace_id = user.get_span_context().trace_id
    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    hook_spans = [s for s in spans if s.name == "actions.hook"]
    assert sorted(s.attributes["quarry.event"] for s in hook_spans) == ["post-commit", "pre-commit"]
    commit_span = next(s for s in spans if s.name == "graveler.commit")
    pre = next(s for s in hook_spans if s.attributes["quarry.event"] == "pre-commit")
    assert pre.parent is not None and pre.parent.span_id == commit_span.context.span_id
    assert all(s.attributes["http.status_code"] == 200 for s in hook_spans)
    text = generate_latest().decode()
    assert 'quarry_action_runs_total{event="pre-commit",status="passed"}' in text
    assert 'quarry_action_hook_seconds_count{event="post-commit",status="passed"}' in text


# ---- the README's example -----------------------------------------------------------------


def test_the_schema_gate_example_refuses_then_accepts_a_merge(suite, client, repo, tmp_path):
    """examples/actions/schema_gate.py as the README walks through it: branch → write a
    Parquet file without the column → merge refused → fix → merge accepted."""
    import importlib.util
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    source = Path(__file__).resolve().parents[3] / "examples" / "actions" / "schema_gate.py"
    spec = importlib.util.spec_from_file_location("schema_gate", source)
    assert spec is not None and spec.loader is not None
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    server = ThreadingHTTPServer(("127.0.0.1", 0), gate.handler_for(client, "user_id"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        events = "  pre-merge:\n    branches: [main]\n"
        put_file(
            suite,
            client,
            repo,
            "main",
            "_quarry_actions/schema.yaml",
            action(url, events, name="schema gate"),
        )
        client.commit(repo, "main", "the gate")
        client.create_branch(repo, "ingest", "main")

        def parquet(columns: dict) -> bytes:
            out = io.BytesIO()
            pq.write_table(pa.table(columns), out)
            return out.getvalue()

        put_file(suite, client, repo, "ingest", "events/day1.parquet", parquet({"event": ["a"]}))
        client.commit(repo, "ingest", "day 1, no user_id")
        before = head(client, repo, "main")
        with pytest.raises(errors.FailedPrecondition) as refused:
            client.merge(repo, "ingest", "main")
        assert refused.value.reason == "HOOK_FAILED"
        run = client.get_action_run(repo, refused.value.metadata["run_id"])
        assert "missing column 'user_id' in: events/day1.parquet" in run.hooks[0].output
        assert head(client, repo, "main") == before
        put_file(
            suite,
            client,
            repo,
            "ingest",
            "events/day1.parquet",
            parquet({"event": ["a"], "user_id": [1]}),
        )
        client.commit(repo, "ingest", "day 1 with user_id")
        merged = client.merge(repo, "ingest", "main").commit
        assert head(client, repo, "main") == merged.id
    finally:
        server.shutdown()
        server.server_close()


def test_a_hook_secret_from_the_environment_signs_the_call(suite, client, repo, hooks, monkeypatch):
    """The committer runs in this process: its environment is ours."""
    monkeypatch.setenv("QUARRYACTION_TEST_HOOK_SECRET", "shared-with-the-receiver")
    doc = action(hooks.url + "/ok", "  pre-commit:\n").replace(
        b"      query_params:",
        b"      secret: '{{ ENV.QUARRYACTION_TEST_HOOK_SECRET }}'\n      query_params:",
    )
    put_file(suite, client, repo, "main", "_quarry_actions/gate.yaml", doc)
    client.commit(repo, "main", "signed")
    (call,) = hooks.calls
    assert webhook.verify(b"shared-with-the-receiver", call["raw"], call["signature"])


# ---- branches and tags (branch-manager) -----------------------------------------------------


def test_branch_and_tag_events_fire_and_a_failing_pre_hook_refuses(suite, client, repo, hooks):
    events = "".join(
        f"  {phase}-{kind}:\n"
        for kind in ("create-branch", "delete-branch", "create-tag", "delete-tag")
        for phase in ("pre", "post")
    )
    put_file(
        suite, client, repo, "main", "_quarry_actions/refs.yaml", action(hooks.url + "/ok", events)
    )
    commit = client.commit(repo, "main", "ref hooks").commit
    client.create_branch(repo, "feature", "main")
    client.delete_branch(repo, "feature")
    client.create_tag(repo, "v1", "main")
    client.delete_tag(repo, "v1")
    assert hooks.events() == [
        "pre-create-branch",
        "post-create-branch",
        "pre-delete-branch",
        "post-delete-branch",
        "pre-create-tag",
        "post-create-tag",
        "pre-delete-tag",
        "post-delete-tag",
    ]
    created = hooks.calls[0]["body"]
    assert created["branch_id"] == "feature" and created["source_ref"] == "main"
    assert created["commit_id"] == commit.id
    tagged = hooks.calls[4]["body"]
    assert tagged["tag_id"] == "v1" and tagged["commit_id"] == commit.id
    # A refusing pre-create-branch: no branch.
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/refs.yaml",
        action(hooks.url + "/fail", events),
    )
    client.commit(repo, "main", "refuse")
    with pytest.raises(errors.FailedPrecondition) as refused:
        client.create_branch(repo, "refused", "main")
    assert refused.value.reason == "HOOK_FAILED"
    with pytest.raises(errors.NotFound):
        client.get_branch(repo, "refused")
    with pytest.raises(errors.FailedPrecondition):
        client.create_tag(repo, "v2", "main")
    with pytest.raises(errors.NotFound):
        client.get_tag(repo, "v2")


# ---- revert, cherry-pick, import (the commits lakeFS gates too) ----------------------------


def test_revert_and_cherry_pick_fire_their_own_events(suite, client, repo, hooks):
    """lakeFS's pre/post-revert and pre/post-cherry-pick: action files of the branch HEAD
    the operation starts from (pre) and of the commit made (post)."""
    events = "".join(
        f"  {phase}-{kind}:\n    branches: [main]\n"
        for kind in ("revert", "cherry-pick")
        for phase in ("pre", "post")
    )
    put_file(
        suite, client, repo, "main", "_quarry_actions/gate.yaml", action(hooks.url + "/ok", events)
    )
    client.commit(repo, "main", "actions")
    put_file(suite, client, repo, "main", "data/bad.parquet", b"PAR1bad")
    bad = client.commit(repo, "main", "bad data").commit
    assert hooks.events() == []  # commits are not reverts
    reverted = client.revert(repo, "main", bad.id)
    assert hooks.events() == ["pre-revert", "post-revert"]
    pre, post = (c["body"] for c in hooks.calls)
    for body in (pre, post):
        assert body["branch_id"] == body["source_ref"] == "main"
        assert body["metadata"] == {"quarry.revert": bad.id}
        assert body["commit_message"] == "Revert 'bad data'"
    assert pre["commit_id"] == "" and post["commit_id"] == reverted.id
    client.create_branch(repo, "feature", bad.id)
    put_file(suite, client, repo, "feature", "data/fix.parquet", b"PAR1fix")
    fix = client.commit(repo, "feature", "the fix").commit
    picked = client.cherry_pick(repo, "main", fix.id)
    assert hooks.events()[2:] == ["pre-cherry-pick", "post-cherry-pick"]
    assert hooks.calls[3]["body"]["commit_id"] == picked.id
    assert hooks.calls[2]["body"]["metadata"] == {"quarry.cherry-pick": fix.id}
    assert {r.event_type for r in runs(suite, repo)} == {
        "pre-revert",
        "post-revert",
        "pre-cherry-pick",
        "post-cherry-pick",
    }


@pytest.mark.parametrize("kind", ["revert", "cherry-pick"])
def test_a_refusing_pre_revert_or_cherry_pick_hook_changes_nothing(
    suite, client, repo, hooks, kind
):
    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/fail", f"  pre-{kind}:\n"),
    )
    client.commit(repo, "main", "actions")
    client.create_branch(repo, "feature", "main")
    put_file(suite, client, repo, "feature", "data/x.parquet", b"PAR1x")
    change = client.commit(repo, "feature", "x").commit
    target = "feature" if kind == "revert" else "main"
    before = head(client, repo, target)
    with pytest.raises(errors.FailedPrecondition) as refused:
        if kind == "revert":
            client.revert(repo, target, change.id)
        else:
            client.cherry_pick(repo, target, change.id)
    assert refused.value.reason == "HOOK_FAILED"
    assert f"pre-{kind}" in refused.value.message
    assert head(client, repo, target) == before
    assert staged_paths(client, repo, target) == set()
    (recorded,) = runs(suite, repo)
    assert recorded.event_type == f"pre-{kind}" and recorded.status == "failed"
    assert recorded.run_id in refused.value.message


def _wait_import(client, repo: str, import_id: str):
    from quarry.v1 import committer_pb2 as cm
    from support.wait import wait_until

    def done():
        status = client.get_import_status(repo, import_id)
        return status if status.state != cm.IMPORT_STATE_RUNNING else None

    return wait_until(done, timeout=60, what=f"import {import_id} to end")


def test_an_import_is_a_commit_for_hooks_and_a_refusal_leaves_the_branch(
    suite, client, repo, hooks, tmp_path
):
    """As lakeFS's Graveler.Import: pre-commit judges the import's metarange (its action
    files, including imported ones), post-commit fires with the commit made."""
    from quarry.v1 import committer_pb2 as cm

    put_file(suite, client, repo, "main", "staged/kept.txt", b"kept")
    source = tmp_path / "lake"
    (source / "_quarry_actions").mkdir(parents=True)
    (source / "_quarry_actions" / "gate.yaml").write_bytes(
        action(hooks.url + "/fail", "  pre-commit:\n")
    )
    (source / "t" / "part-0.parquet").parent.mkdir(parents=True)
    (source / "t" / "part-0.parquet").write_bytes(b"PAR1")
    before = head(client, repo, "main")
    refused = _wait_import(client, repo, client.start_import(repo, "main", [(str(source), "")]).id)
    assert refused.state == cm.IMPORT_STATE_FAILED
    assert "HTTP 400" in refused.error and "the branch is unchanged" in refused.error
    assert head(client, repo, "main") == before
    assert staged_paths(client, repo, "main") == {"staged/kept.txt"}
    assert hooks.events() == ["pre-commit"]
    assert hooks.calls[0]["body"]["metadata"]["import_id"] == refused.id
    # The hook now passes: the import commits, and post-commit fires with its commit.
    (source / "_quarry_actions" / "gate.yaml").write_bytes(
        action(hooks.url + "/ok", "  pre-commit:\n  post-commit:\n")
    )
    done = _wait_import(client, repo, client.start_import(repo, "main", [(str(source), "")]).id)
    assert done.state == cm.IMPORT_STATE_COMPLETED
    assert head(client, repo, "main") == done.commit.id
    assert hooks.events()[1:] == ["pre-commit", "post-commit"]
    post = hooks.calls[2]["body"]
    assert post["commit_id"] == done.commit.id and post["metadata"]["import_id"] == done.id
    assert staged_paths(client, repo, "main") == {"staged/kept.txt"}


def test_an_imported_action_file_edited_at_its_source_is_refused_not_run(
    suite, client, repo, hooks, tmp_path
):
    """Safety rule: the hooks that gate a branch are its action files as committed. An
    imported file's bytes stay at its source, which someone without commit rights may
    write: an edit there, even one of the same size, must not turn the gate off."""
    from quarry.v1 import committer_pb2 as cm

    source = tmp_path / "lake"
    gate = source / "_quarry_actions" / "gate.yaml"
    gate.parent.mkdir(parents=True)
    gate.write_bytes(action(hooks.url + "/fail", "  pre-merge:\n"))
    (source / "t").mkdir()
    (source / "t" / "part-0.parquet").write_bytes(b"PAR1")
    done = _wait_import(client, repo, client.start_import(repo, "main", [(str(source), "")]).id)
    assert done.state == cm.IMPORT_STATE_COMPLETED, done.error
    # The import read the action file (and only it) and recorded its SHA-256.
    entry = client.stat_object(repo, "main", "_quarry_actions/gate.yaml")
    assert entry.checksum == hashlib.sha256(gate.read_bytes()).hexdigest()
    assert client.stat_object(repo, "main", "t/part-0.parquet").checksum == ""
    client.create_branch(repo, "feat", "main")
    put_file(suite, client, repo, "feat", "t/part-1.parquet", b"PAR1")
    client.commit(repo, "feat", "add part-1")
    before = head(client, repo, "main")
    with pytest.raises(errors.FailedPrecondition) as refused:
        client.merge(repo, "feat", "main")
    assert refused.value.reason == "HOOK_FAILED"
    # Same size, other bytes: a hook that would answer 200.
    edited = gate.read_bytes().replace(b"/fail", b"/okok")
    assert len(edited) == gate.stat().st_size
    gate.write_bytes(edited)
    with pytest.raises(errors.FailedPrecondition) as refused:
        client.merge(repo, "feat", "main")
    assert refused.value.reason == "INVALID_ACTION_FILE", refused.value
    assert "_quarry_actions/gate.yaml" in refused.value.message
    assert "SHA-256" in refused.value.message
    assert head(client, repo, "main") == before
    assert hooks.events() == ["pre-merge"]  # the edited file's hook was never called


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (it answers no request); /proc says which.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_detached_schema_gate_answers_and_stops_with_its_shell():
    """The README starts the example with `eval "$(... --detach)"`: it must serve while
    that shell lives and leave nothing running once the shell is gone (a failed script
    included)."""
    import subprocess
    import urllib.request

    from support.processes import REPO_ROOT, VENV_BIN
    from support.wait import wait_until

    shell = subprocess.Popen(
        ["bash", "--noprofile", "--norc"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        gate = f"{VENV_BIN / 'python'} examples/actions/schema_gate.py --port 0 --detach"
        shell.stdin.write(f'eval "$({gate})"\necho "$SCHEMA_GATE_URL $SCHEMA_GATE_PID"\n')
        shell.stdin.flush()
        url, pid_text = shell.stdout.readline().split()
        pid = int(pid_text)
        request = urllib.request.Request(url, data=b'{"event_type": "post-commit"}')
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200 and answer.read() == b"schema ok"
        assert _alive(pid)
    finally:
        shell.stdin.close()
        shell.wait(timeout=30)
    wait_until(lambda: not _alive(pid), timeout=20, what="the detached gate to stop")


def test_an_import_waiting_on_a_slow_pre_commit_hook_stays_running(hooks, tmp_path):
    """Hooks may run for minutes (QUARRY_ACTIONS_MAX_TIMEOUT_SECONDS): the import keeps its
    status record fresh meanwhile, so it never reads as a dead import (FAILED), and then
    completes."""
    import time

    from quarry.graveler import layout
    from quarry.graveler.imports import ImportRecord
    from quarry.kv.memory import MemoryStore
    from quarry.v1 import committer_pb2 as cm
    from support.suite import running_suite
    from support.wait import wait_until

    stale = 1.0
    backend = MemoryStore()
    source = tmp_path / "lake"
    (source / "_quarry_actions").mkdir(parents=True)
    (source / "_quarry_actions" / "gate.yaml").write_bytes(
        action(hooks.url + "/slow", "  pre-commit:\n", timeout="60s")
    )
    with (
        running_suite(
            tmp_path / "suite",
            backend=backend,
            import_heartbeat_seconds=0.1,
            import_stale_seconds=stale,
        ) as suite,
        suite.client() as client,
    ):
        client.create_repository("slow", suite.namespace("slow"))
        partition = RefManager(backend).get_repository("slow").partition
        started = client.start_import("slow", "main", [(str(source), "")])
        assert hooks.entered.wait(30)
        entered = time.time()

        def record() -> ImportRecord:
            return ImportRecord.decode(backend.get(partition, layout.import_key(started.id)).value)

        # Written again more than the stale window after the hook started: a heartbeat.
        wait_until(lambda: record().updated > entered + stale, timeout=30, what="a heartbeat")
        assert client.get_import_status("slow", started.id).state == cm.IMPORT_STATE_RUNNING
        hooks.release.set()
        done = _wait_import(client, "slow", started.id)
        assert done.state == cm.IMPORT_STATE_COMPLETED, done.error


# ---- hooks bounded by the caller -------------------------------------------------------------


def test_a_hook_is_cut_at_the_callers_deadline_and_its_run_is_recorded(suite, client, repo, hooks):
    """The hook's own timeout (60 s by default) is longer than the caller waits: it is cut
    at the caller's deadline, and the run -- whose hook was called and may have acted -- is
    recorded all the same (its record is written with a deadline of its own)."""
    from quarry import errors
    from support.wait import wait_until

    put_file(
        suite,
        client,
        repo,
        "main",
        "_quarry_actions/gate.yaml",
        action(hooks.url + "/slow", "  pre-commit:\n"),
    )
    with suite.client(timeout=2.0) as hurried, pytest.raises(errors.QuarryError) as refused:
        hurried.commit(repo, "main", "in a hurry")
    assert refused.value.code.name in ("DEADLINE_EXCEEDED", "FAILED_PRECONDITION")
    assert hooks.entered.is_set()  # the hook was called (and still holds its answer)

    def recorded():
        runs = list(client.list_action_runs(repo, branch="main").runs)
        return runs if runs and runs[0].status == "failed" else None

    runs = wait_until(recorded, timeout=30, interval=0.1, what="the run's record")
    hooks.release.set()
    assert "timed out" in runs[0].hooks[0].error
    # The refused pre-commit hook left nothing committed.
    assert "in a hurry" not in [c.message for c in client.iter_log(repo, "main")]


@pytest.mark.parametrize("event", ["commit", "merge"])
def test_a_slow_post_hook_never_turns_a_done_operation_into_a_deadline_error(
    suite, client, repo, hooks, event
):
    """Post-event hooks never change the outcome (docs/actions.md): one slower than the
    caller waits is cut with time left for the answer, and the caller hears of its commit
    or merge — it got DEADLINE_EXCEEDED for an operation that had landed, and a retry then
    answered NO_CHANGES or merged again."""
    from support.wait import wait_until

    # The action file comes with the commit (or, for a merge, its source: a merge runs
    # the source's action files), so no earlier event calls the slow hook.
    branch = "side" if event == "merge" else "main"
    if event == "merge":
        client.create_branch(repo, "side", "main")
    notify = action(hooks.url + "/slow", f"  post-{event}:\n")
    put_file(suite, client, repo, branch, "_quarry_actions/notify.yaml", notify)
    put_file(suite, client, repo, branch, "c/one", b"1")
    if event == "merge":
        client.commit(repo, "side", "one on side")
    # 12 s: the hook is cut at 11 s, leaving the whole 1 s margin for the answer (a tenth
    # of the wait, at most 1 s): room enough on a loaded machine.
    with suite.client(timeout=12.0) as hurried:
        if event == "merge":
            made = hurried.merge(repo, "side", "main").commit
        else:
            made = hurried.commit(repo, "main", "in a hurry").commit
    assert hooks.entered.is_set()
    assert head(client, repo, "main") == made.id

    def recorded():
        runs = list(client.list_action_runs(repo, branch="main").runs)
        return runs if runs and runs[0].event == f"post-{event}" else None

    (run, *_) = wait_until(recorded, timeout=30, interval=0.1, what="the post-event run")
    hooks.release.set()
    assert run.status == "failed" and "timed out" in run.hooks[0].error
