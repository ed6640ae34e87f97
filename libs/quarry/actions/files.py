"""Action files: YAML documents under `_quarry_actions/` (and lakeFS's `_lakefs_actions/`)
read from the ref an event is about. A file that does not parse or validate fails the
pre-event naming the file and, where YAML knows it, the line (never silently ignored)."""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from quarry import errors
from quarry.httpsyntax import is_header_name

# Both prefixes sort next to each other ("_lakefs_actions/" < "_quarry_actions/"), so one
# listing of the "_" prefix from the first to past the second finds every action file.
PREFIXES = ("_lakefs_actions/", "_quarry_actions/")
SUFFIXES = (".yaml", ".yml")

PRE_COMMIT = "pre-commit"
POST_COMMIT = "post-commit"
PRE_MERGE = "pre-merge"
POST_MERGE = "post-merge"
EVENTS = (
    PRE_COMMIT,
    POST_COMMIT,
    PRE_MERGE,
    POST_MERGE,
    "pre-create-branch",
    "post-create-branch",
    "pre-delete-branch",
    "post-delete-branch",
    "pre-create-tag",
    "post-create-tag",
    "pre-delete-tag",
    "post-delete-tag",
    # lakeFS's names for these two commits (pkg/graveler/hooks_handler.go): they are
    # their own events, not pre/post-commit (an import is a commit: pre/post-commit).
    "pre-revert",
    "post-revert",
    "pre-cherry-pick",
    "post-cherry-pick",
)
HOOK_TYPES = ("webhook",)
_HOOK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# A secret is never literal in a file: a property value may name an environment variable.
ENV_REFERENCE = re.compile(r"\{\{\s*ENV\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# ... but only one meant for hooks. Safety rule: an action file (which anyone who may commit
# can write) never reads another variable of the process running its hooks -- the signing
# key, cloud credentials, any QUARRY_* setting -- which would hand it to the hook's URL
# (lakeFS's LAKEFSACTION_ rule).
ENV_PREFIX = "QUARRYACTION_"


# An action file is a few lines of YAML; anyone who may commit can write one, and it is
# parsed on every event of its branch: past this size it is refused unread (a large or
# alias-amplified document would cost the committer seconds and hundreds of MB each time).
MAX_ACTION_FILE_BYTES = 64 * 1024


class InvalidActionFile(errors.FailedPrecondition):
    """An action file that does not parse or validate: the pre-event it would gate fails."""

    reason = "INVALID_ACTION_FILE"


@dataclass(frozen=True)
class Hook:
    id: str
    type: str
    description: str = ""
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    name: str
    path: str  # the file it came from
    on: dict[str, tuple[str, ...]]  # event → branch globs (empty: every branch)
    hooks: tuple[Hook, ...]

    def matches(self, event: str, branch: str) -> bool:
        if event not in self.on:
            return False
        globs = self.on[event]
        return not globs or any(fnmatch.fnmatchcase(branch, g) for g in globs)


def is_action_path(path: str) -> bool:
    return path.startswith(PREFIXES) and path.endswith(SUFFIXES) and "/" not in _tail(path)


def _tail(path: str) -> str:
    return path.split("/", 1)[1]


def _fail(path: str, message: str, line: int | None = None) -> InvalidActionFile:
    where = f"{path}:{line}" if line else path
    return InvalidActionFile(
        f"invalid action file {where}: {message}",
        metadata={"path": path, "line": str(line or 0)},
    )


@functools.cache
def _line_loader() -> type:
    """A safe loader that remembers the line of each mapping (for messages). Made on the
    first parse: only a process that reads an action file loads PyYAML."""
    import yaml

    class Lines(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            # No aliases (*name): each would be a copy of its anchor's tree, and nested
            # ones multiply ("billion laughs") — nothing an action file needs.
            if self.check_event(yaml.events.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in an action file", mark
                )
            return super().compose_node(parent, index)

    def mapping_with_line(loader: Lines, node: yaml.MappingNode) -> dict[str, Any]:
        mapping = loader.construct_mapping(node, deep=True)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping

    Lines.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping_with_line)
    return Lines


def parse(path: str, data: bytes) -> Action:
    """One action file → an Action; InvalidActionFile naming the file and line otherwise."""
    import yaml  # here, not at the top: most processes never read an action file

    if len(data) > MAX_ACTION_FILE_BYTES:
        raise too_large(path, len(data))

    try:
        doc = yaml.load(data, Loader=_line_loader())
    except yaml.MarkedYAMLError as bad:
        line = bad.problem_mark.line + 1 if bad.problem_mark else None
        raise _fail(path, bad.problem or str(bad), line) from None
    except yaml.YAMLError as bad:
        raise _fail(path, str(bad)) from None
    except RecursionError:
        raise _fail(path, "nested too deeply to be an action file") from None
    if not isinstance(doc, dict):
        raise _fail(path, "expected a mapping with name, on and hooks", 1)
    line = doc.get("__line__")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(path, "`name` is required (a string)", line)
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as True
    if not isinstance(on, dict) or not [k for k in on if k != "__line__"]:
        raise _fail(path, "`on` must map at least one event", line)
    events: dict[str, tuple[str, ...]] = {}
    for event, spec in on.items():
        if event == "__line__":
            continue
        if event not in EVENTS:
            raise _fail(
                path, f"unknown event {event!r} (one of {', '.join(EVENTS)})", on["__line__"]
            )
        globs: list[str] = []
        if spec is not None:
            if not isinstance(spec, dict):
                raise _fail(path, f"event {event!r}: expected a mapping", on["__line__"])
            branches = spec.get("branches") or []
            if not isinstance(branches, list) or not all(isinstance(b, str) for b in branches):
                raise _fail(
                    path, f"event {event!r}: `branches` must be a list of globs", spec["__line__"]
                )
            globs = branches
        events[event] = tuple(globs)
    hooks_doc = doc.get("hooks")
    if not isinstance(hooks_doc, list) or not hooks_doc:
        raise _fail(path, "`hooks` must be a non-empty list", line)
    hooks: list[Hook] = []
    seen: set[str] = set()
    for item in hooks_doc:
        if not isinstance(item, dict):
            raise _fail(path, "each hook must be a mapping", line)
        hook_line = item.get("__line__")
        hook_id = item.get("id")
        if not isinstance(hook_id, str) or not _HOOK_ID.match(hook_id):
            raise _fail(path, "a hook needs an `id` (letters, digits, _ . -)", hook_line)
        if hook_id in seen:
            raise _fail(path, f"hook id {hook_id!r} appears twice", hook_line)
        seen.add(hook_id)
        kind = item.get("type")
        if kind not in HOOK_TYPES:
            raise _fail(path, f"hook {hook_id!r}: type must be one of {HOOK_TYPES}", hook_line)
        properties = item.get("properties") or {}
        if not isinstance(properties, dict):
            raise _fail(path, f"hook {hook_id!r}: `properties` must be a mapping", hook_line)
        properties = _without_lines(properties)
        _check_webhook_properties(path, hook_id, properties, hook_line)
        description = item.get("description") or ""
        hooks.append(Hook(hook_id, kind, str(description), properties))
    return Action(name, path, events, tuple(hooks))


def too_large(path: str, size: int) -> InvalidActionFile:
    return _fail(path, f"{size} bytes; an action file has at most {MAX_ACTION_FILE_BYTES}")


def _check_url(path: str, hook_id: str, url: Any, line: int | None) -> None:
    """An http(s) URL with a host and a valid port (the guard, quarry.actions.webhook,
    decides at call time where it may go)."""
    import urllib.parse

    bad = _fail(path, f"hook {hook_id!r}: `properties.url` must be an http(s) URL", line)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise bad
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 — raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise _fail(path, f"hook {hook_id!r}: bad URL {url!r} ({exc})", line) from None
    if not parts.hostname:
        raise bad


def _check_webhook_properties(
    path: str, hook_id: str, properties: dict[str, Any], line: int | None
) -> None:
    _check_url(path, hook_id, properties.get("url"), line)
    timeout = properties.get("timeout")
    if timeout is not None and parse_duration(timeout) is None:
        raise _fail(path, f"hook {hook_id!r}: bad timeout {timeout!r} (e.g. 30s, 2m, 1.5)", line)
    for key in ("headers", "query_params"):
        mapping = properties.get(key) or {}
        if not isinstance(mapping, dict):
            raise _fail(path, f"hook {hook_id!r}: `{key}` must be a mapping", line)
        for name, value in mapping.items():
            # query_params as lakeFS takes them: a scalar, or a list (repeated parameters).
            values = value if key == "query_params" and isinstance(value, list) else [value]
            allowed = (str, int, float, bool, type(None)) if key == "query_params" else (str,)
            if not all(isinstance(v, allowed) for v in values):
                what = "a scalar or a list of scalars" if key == "query_params" else "a string"
                raise _fail(path, f"hook {hook_id!r}: `{key}.{name}` must be {what}", line)
            # A name HTTP allows (http.client refuses any other at send time).
            if key == "headers" and not (
                isinstance(name, str) and len(name) <= 256 and is_header_name(name)
            ):
                raise _fail(path, f"hook {hook_id!r}: {name!r} is not an HTTP header name", line)
    for key in ("secret", "headers", "query_params"):
        value = properties.get(key)
        texts = value.values() if isinstance(value, dict) else [value]
        for text in texts:
            if text is None or text == "":
                continue
            if key != "query_params" and not (
                isinstance(text, str) and ENV_REFERENCE.fullmatch(text.strip())
            ):
                raise _fail(
                    path,
                    f"hook {hook_id!r}: `{key}` values must be environment references "
                    f"like {{{{ ENV.{ENV_PREFIX}NAME }}}}, never literal secrets",
                    line,
                )
            for name in ENV_REFERENCE.findall(str(text)):
                if not name.startswith(ENV_PREFIX):
                    raise _fail(path, f"hook {hook_id!r}: {_outside_prefix(name)}", line)


def _without_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_without_lines(v) for v in value]
    return value


def query_text(value: Any) -> str:
    """A query parameter's value as sent: true/false for a YAML boolean, "" for none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_duration(value: Any) -> float | None:
    """30s, 2m, 500ms, 1h or a number of seconds → seconds; None when not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if not found:
        return None
    number = float(found.group(1))
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[found.group(2)]
    seconds = number * scale
    return seconds if seconds > 0 else None


def _outside_prefix(name: str) -> str:
    return (
        f"environment variable {name!r} may not be referenced: an action reads only "
        f"variables named {ENV_PREFIX}*"
    )


def resolve_env(text: str, environ: dict[str, str]) -> str:
    """Replace {{ ENV.NAME }} references (a missing variable is an error, not ""; a name
    without ENV_PREFIX is refused whatever the file's validation let through)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith(ENV_PREFIX):
            raise InvalidActionFile(_outside_prefix(name), metadata={"variable": name})
        if name not in environ:
            raise errors.FailedPrecondition(
                f"environment variable {name!r} named by an action is not set",
                metadata={"variable": name},
            )
        return environ[name]

    return ENV_REFERENCE.sub(value, text)


def matching(actions: list[Action], event: str, branch: str) -> list[Action]:
    """The actions that run for an event on a branch, in path order (deterministic)."""
    return sorted((a for a in actions if a.matches(event, branch)), key=lambda a: a.path)
