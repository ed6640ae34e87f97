"""Action files: what parses, what is refused (with the file and line), what matches."""

import pytest

from quarry.actions import files

HOOK = b"hooks:\n  - id: h\n    type: webhook\n    properties:\n      url: http://127.0.0.1/\n"


@pytest.mark.parametrize(
    ("doc", "where", "says"),
    [
        (b"name: x\non:\n  pre-comit:\n" + HOOK, "a.yaml:3", "unknown event 'pre-comit'"),
        (
            b"name: x\non:\n  pre-commit:\nhooks:\n  - id: h\n    type: webhook\n"
            b"    properties:\n      url: ftp://x/\n",
            "a.yaml:5",
            "must be an http(s) URL",
        ),
        (b"name: x\non:\n  pre-commit:\nhooks: [\n", "a.yaml:5", "expected the node content"),
        (b"on:\n  pre-commit:\n" + HOOK, "a.yaml:1", "`name` is required"),
        (b"name: x\non:\n  pre-commit:\n    branches: main\n" + HOOK, "a.yaml:4", "list of globs"),
        (
            b"name: x\non:\n  pre-commit:\n" + HOOK + b"      timeout: soon\n",
            "a.yaml:5",
            "bad timeout",
        ),
        (b"name: x\non:\n  pre-commit:\n" + HOOK + HOOK[7:], "a.yaml:9", "appears twice"),
    ],
)
def test_an_invalid_file_is_refused_naming_file_and_line(doc, where, says):
    with pytest.raises(files.InvalidActionFile) as refused:
        files.parse("_quarry_actions/a.yaml", doc)
    assert f"_quarry_actions/{where}:" in refused.value.message
    assert says in refused.value.message
    assert refused.value.reason == "INVALID_ACTION_FILE"


def test_events_match_by_branch_glob():
    action = files.parse(
        "_lakefs_actions/a.yml",
        b"name: x\non:\n  pre-merge:\n    branches: [main, 'release-*']\n  post-commit:\n" + HOOK,
    )
    assert action.matches("pre-merge", "main")
    assert action.matches("pre-merge", "release-2026")
    assert not action.matches("pre-merge", "dev")
    assert action.matches("post-commit", "anything")
    assert not action.matches("pre-commit", "main")


def test_only_files_directly_under_the_prefixes_are_action_files():
    assert files.is_action_path("_quarry_actions/a.yaml")
    assert files.is_action_path("_lakefs_actions/b.yml")
    assert not files.is_action_path("_quarry_actions/sub/a.yaml")
    assert not files.is_action_path("_quarry_actions/README.md")
    assert not files.is_action_path("data/_quarry_actions/a.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("2m", 120), ("500ms", 0.5), (1.5, 1.5), ("0s", None)]
)
def test_durations(text, seconds):
    assert files.parse_duration(text) == seconds


def test_environment_references_resolve_and_a_missing_one_is_an_error():
    environ = {"QUARRYACTION_T": "abc"}
    assert files.resolve_env("Bearer {{ ENV.QUARRYACTION_T }}", environ) == "Bearer abc"
    with pytest.raises(Exception, match="'QUARRYACTION_T' named by an action is not set"):
        files.resolve_env("{{ ENV.QUARRYACTION_T }}", {})


@pytest.mark.parametrize("name", ["QUARRY_AUTH_SIGNING_KEY", "AWS_SECRET_ACCESS_KEY", "HOME"])
def test_an_action_reads_no_variable_outside_its_prefix(name):
    """The signing key, cloud credentials, any setting: never resolved, even if set, and a
    file naming one is refused when parsed (headers, secret and query parameters alike)."""
    with pytest.raises(files.InvalidActionFile, match="QUARRYACTION_"):
        files.resolve_env("{{ ENV." + name + " }}", {name: "leaked"})
    for where in (
        b"      headers:\n        X-Style: '{{ ENV.%s }}'\n",
        b"      secret: '{{ ENV.%s }}'\n",
        b"      query_params:\n        q: 'x-{{ ENV.%s }}'\n",
    ):
        doc = (
            b"name: x\non:\n  pre-commit:\nhooks:\n  - id: h\n    type: webhook\n"
            b"    properties:\n      url: http://127.0.0.1/\n" + where % name.encode()
        )
        with pytest.raises(files.InvalidActionFile, match="may not be referenced"):
            files.parse("_quarry_actions/x.yaml", doc)


def test_lakefs_revert_and_cherry_pick_events_parse():
    """lakeFS's names (pkg/graveler/hooks_handler.go): a lakeFS file using them works here."""
    events = b"".join(
        b"  %s-%s:\n" % (phase, kind)
        for kind in (b"revert", b"cherry-pick")
        for phase in (b"pre", b"post")
    )
    action = files.parse("_lakefs_actions/a.yaml", b"name: x\non:\n" + events + HOOK)
    for event in ("pre-revert", "post-revert", "pre-cherry-pick", "post-cherry-pick"):
        assert action.matches(event, "main")
    assert not action.matches("pre-commit", "main")


def test_an_action_file_nested_too_deeply_is_an_invalid_action_file():
    with pytest.raises(files.InvalidActionFile, match="nested too deeply"):
        files.parse("_quarry_actions/deep.yaml", b"[" * 30_000 + b"]" * 30_000)


def _webhook(properties: str) -> bytes:
    return (
        b"name: x\non:\n  pre-commit:\nhooks:\n  - id: h\n    type: webhook\n    properties:\n"
        + properties.encode()
    )


@pytest.mark.parametrize(
    ("properties", "says"),
    [
        ("      url: http://127.0.0.1:99999/\n", "bad URL"),
        ("      url: http://127.0.0.1:abc/\n", "bad URL"),
        ('      url: "http://[::1/"\n', "bad URL"),
        ("      url: http:///path\n", "must be an http(s) URL"),
        (
            "      url: http://127.0.0.1/\n      headers: ['{{ ENV.QUARRYACTION_X }}']\n",
            "`headers` must be a mapping",
        ),
        (
            "      url: http://127.0.0.1/\n      headers: '{{ ENV.QUARRYACTION_X }}'\n",
            "`headers` must be a mapping",
        ),
        (
            "      url: http://127.0.0.1/\n      headers:\n"
            "        'X:Evil': '{{ ENV.QUARRYACTION_X }}'\n",
            "not an HTTP header name",
        ),
        ("      url: http://127.0.0.1/\n      query_params: [a]\n", "must be a mapping"),
        (
            "      url: http://127.0.0.1/\n      query_params:\n        a: {b: 1}\n",
            "a scalar or a list of scalars",
        ),
        # Literal secrets are refused whatever their YAML type (a number was let through).
        ("      url: http://127.0.0.1/\n      secret: 123456789\n", "environment references"),
        (
            "      url: http://127.0.0.1/\n      headers:\n        X-Api-Key: 987654321\n",
            "must be a string",
        ),
    ],
)
def test_a_hook_that_could_not_be_called_is_an_invalid_file_not_an_internal_error(properties, says):
    """What the hook call would fail on (a port out of range, headers that are not a
    mapping of header names) is refused when the file is read, naming it: it was an
    INTERNAL answer on a pre-event and an unrecorded failure on a post-event."""
    with pytest.raises(files.InvalidActionFile) as refused:
        files.parse("_quarry_actions/a.yaml", _webhook(properties))
    assert says in refused.value.message, refused.value.message


def test_query_params_may_be_literal_numbers_and_headers_env_references():
    parsed = files.parse(
        "_quarry_actions/a.yaml",
        _webhook(
            "      url: http://127.0.0.1:8080/\n      query_params:\n        limit: 5\n"
            "      headers:\n        X-Token: '{{ ENV.QUARRYACTION_T }}'\n"
        ),
    )
    assert parsed.hooks[0].properties["query_params"] == {"limit": 5}


def test_yaml_aliases_are_refused_before_they_multiply():
    """A few hundred bytes of nested aliases ("billion laughs") cost the committer seconds
    and hundreds of MB per event, growing tenfold per level: refused at the first alias."""
    levels = ['a0: &a0 "lol"']
    for n in range(1, 5):  # 10,000 strings if expanded (each level tenfold)
        levels.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    doc = (
        b"name: x\non:\n  pre-commit:\n"
        + b"hooks:\n  - id: h\n    type: webhook\n    properties:\n      url: http://127.0.0.1/\n"
        + b"      extra:\n"
        + "".join(f"        {line}\n" for line in levels).encode()
    )
    assert len(doc) < 1024
    with pytest.raises(files.InvalidActionFile) as refused:
        files.parse("_quarry_actions/a.yaml", doc)
    assert "aliases" in refused.value.message and "_quarry_actions/a.yaml:" in refused.value.message


def test_an_action_file_over_the_limit_is_refused_unparsed():
    doc = _webhook("      url: http://127.0.0.1/\n") + b"#" * files.MAX_ACTION_FILE_BYTES
    with pytest.raises(files.InvalidActionFile, match="at most"):
        files.parse("_quarry_actions/a.yaml", doc)


def test_a_hook_whose_call_raises_is_a_failed_hook_and_the_run_is_recorded(monkeypatch):
    """Whatever a call raises (a library's ValueError), the hook failed: the pre-event
    fails HOOK_FAILED with a recorded run, never INTERNAL without one."""
    from quarry.actions import runs, webhook
    from quarry.kv.memory import MemoryStore

    def broken(*args, **kwargs):
        raise ValueError("Port out of range 0-65535")

    monkeypatch.setattr(webhook, "post", broken)
    actions = runs.Actions(MemoryStore())
    action = files.parse("_quarry_actions/a.yaml", _webhook("      url: http://127.0.0.1/\n"))
    event = runs.Event("pre-commit", "repo", "main", "main")
    with pytest.raises(runs.HookFailed) as failed:
        actions.run(b"p", event, [action])
    # Its type, never its text (which can be a header's value: a secret).
    assert "could not be called (ValueError)" in failed.value.message
    assert "Port out of range" not in failed.value.message
    (run,) = actions.list_runs(b"p")[0]
    assert run.status == "failed" and run.hooks[0].error.startswith("the hook could not")


def test_lakefs_query_params_lists_booleans_and_empty_values_are_sent(monkeypatch):
    """lakeFS's own webhook example has `disallow: ["user_", "private_"]`: a list is sent
    as a repeated parameter, a boolean as true/false, an empty value as empty (such files
    were refused as INVALID_ACTION_FILE, blocking every pre-event of their branch)."""
    from quarry.actions import runs, webhook
    from quarry.kv.memory import MemoryStore

    sent = []

    def capture(url, body, query, *args, **kwargs):
        sent.append(list(query))
        return webhook.Response(200, b"ok")

    monkeypatch.setattr(webhook, "post", capture)
    action = files.parse(
        "_lakefs_actions/a.yaml",
        _webhook(
            "      url: http://127.0.0.1/\n      query_params:\n"
            "        disallow: ['user_', 'private_']\n        dry_run: true\n"
            "        prefix: ''\n        limit: 5\n        none:\n"
        ),
    )
    runs.Actions(MemoryStore()).run(b"p", runs.Event("pre-commit", "r", "main", "main"), [action])
    assert sent == [
        [
            ("disallow", "user_"),
            ("disallow", "private_"),
            ("dry_run", "true"),
            ("prefix", ""),
            ("limit", "5"),
            ("none", ""),
        ]
    ]


def test_a_header_value_with_a_line_break_fails_the_hook_without_showing_the_value(
    monkeypatch, caplog
):
    """A hook variable with a trailing newline (a secret read from a file) made http.client
    refuse the header, and the error -- in HOOK_FAILED, the run record and the log -- was
    the whole header value, the secret."""
    import logging

    from quarry.actions import runs
    from quarry.kv.memory import MemoryStore

    secret = "Bearer s3cr3t-value-0123456789"
    action = files.parse(
        "_quarry_actions/a.yaml",
        _webhook(
            "      url: http://127.0.0.1:1/\n      headers:\n"
            "        Authorization: '{{ ENV.QUARRYACTION_TOKEN }}'\n"
        ),
    )
    actions = runs.Actions(MemoryStore(), environ={"QUARRYACTION_TOKEN": secret + "\n"})
    with caplog.at_level(logging.DEBUG), pytest.raises(runs.HookFailed) as failed:
        actions.run(b"p", runs.Event("pre-commit", "r", "main", "main"), [action])
    assert "'Authorization'" in failed.value.message and "line break" in failed.value.message
    (run,) = actions.list_runs(b"p")[0]
    shown = [failed.value.message, run.error, run.hooks[0].error, caplog.text]
    assert not [text for text in shown if "s3cr3t" in text], shown
