"""The console's pages: one handler per page, each a few client calls with the user's token
and a template. Every list is one server page (its page token in the URL: `?page=`), so a
page costs the same on a 1M-entry branch as on a small one.

Safety rules: a page never calls a mutating RPC on GET (only form posts do, and those carry a
CSRF token: quarry.console.app); deleting a repository needs a confirmation form that names
it again, deleting anything else its confirmation page (quarry.console.forms.confirmed);
nothing here decides a permission — the servers do, with the user's token (the upload also
refuses early, before writing a byte, what the user's own policies do not allow). The admin
pages are in quarry.console.admin."""

from __future__ import annotations

import mimetypes
import time
from typing import Any
from urllib.parse import quote

from quarry import errors, uploads
from quarry.auth import policy
from quarry.blob import (
    ObjectNotFound,
    check_stored_size,
    confinement,
    open_object,
    primed,
    size_recorded,
    verified_chunks,
)
from quarry.blob.confine import AddressNotAllowed
from quarry.client import Credentials
from quarry.client.branch_manager import maybe_dirty
from quarry.console import admin, graph, preview, sessions
from quarry.console.app import Context, Route, route
from quarry.console.forms import MissingField, confirm_page, confirmed, required
from quarry.console.http import MAX_FORM_BYTES, Response, redirect, url
from quarry.console.permissions import can, require
from quarry.graveler import errors as gerrors
from quarry.graveler.errors import already_merged

PAGE = 100  # entries per object-browser / compare / changes page
LOG_PAGE = 50
SMALL_PAGE = 50
DOWNLOAD_CHUNK_BYTES = 1 << 20
CHANGE_NAMES = {1: "added", 2: "removed", 3: "changed", 4: "conflict"}


def _repo_url(repo: str, page: str) -> str:
    return f"/repos/{quote(repo, safe='')}/{page}"


def _change_rows(repo: str, ref: str, changes: Any) -> list[tuple[str, str, str, str]]:
    """(kind, path, link to the object at `ref` or "", size) per change. Built here, not in
    the template: a page of 100 rows renders in a fraction of the time."""
    from quarry.console.templates import size

    base = _repo_url(repo, "object")
    rows = []
    for change in changes:
        kind = CHANGE_NAMES.get(change.type, "?")
        removed = change.type == 2
        href = "" if removed or not ref else url(base, ref=ref, path=change.path)
        rows.append((kind, change.path, href, "" if removed else size(change.entry.size_bytes)))
    return rows


# ---- health and sign-in -----------------------------------------------------------------


def health(ctx: Context, params: dict[str, str]) -> Response:
    return Response(200, [("content-type", "text/plain")], b"ok\n")


def login_form(
    ctx: Context, params: dict[str, str], message: str = "", status: int = 200
) -> Response:
    token = sessions.new_login_token()
    # The page to return to: the link that led here, or the refused form's own field.
    back = ctx.request.field("next") or ctx.request.arg("next")
    response = ctx.render("login.html", status, csrf=token, message=message, next=_safe_next(back))
    response.set_cookie(
        sessions.LOGIN_COOKIE, token, secure=ctx.request.secure, max_age=900, path="/login"
    )
    return response


def _safe_next(target: str) -> str:
    """Only a path on this site (never `//host` or a scheme): no open redirect. A target
    is the percent-encoded path and query the browser asked for (quarry.console.app), so
    a backslash, a space or a control character in it is refused: browsers drop tabs and
    newlines from a Location (`/<TAB>/evil.host` is `//evil.host`), and CR/LF would split
    the header. Only ASCII: a header is Latin-1 at most, and what a browser asked for is
    percent-encoded (a raw `/repos/日本` broke the answer after a successful sign-in)."""
    if (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and target.isascii()
        and not any(c <= " " or c == "\x7f" for c in target)
    ):
        return target
    return "/repos"


def login(ctx: Context, params: dict[str, str]) -> Response:
    request = ctx.request
    if not sessions.check_csrf(
        request.cookies.get(sessions.LOGIN_COOKIE, ""), request.field("csrf")
    ):
        return login_form(ctx, params, "The form expired: sign in again.", 403)
    key_id, secret = request.field("access_key_id").strip(), request.field("secret_access_key")
    if not key_id or not secret:
        return login_form(ctx, params, "Enter an access key id and its secret.", 400)
    try:
        answer = ctx.client.login(Credentials(key_id, secret))
    except errors.QuarryError as exc:
        if exc.code.name in ("UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT"):
            return login_form(ctx, params, f"Sign-in refused ({exc.reason}).", 401)
        raise
    with_token = ctx.console.client(answer.token)
    me = with_token.whoami()
    # A fresh id whatever cookie came in (session fixation): the old one is forgotten.
    session = ctx.store.create(
        me.principal_id,
        answer.token,
        float(answer.expires_at.seconds) or time.time() + 3600,
        replaces=request.cookies.get(sessions.SESSION_COOKIE, ""),
    )
    session.cache["client"] = with_token  # the session's client (quarry.console.app)
    response = redirect(_safe_next(request.field("next")))
    response.set_cookie(sessions.SESSION_COOKIE, session.id, secure=request.secure)
    response.set_cookie(sessions.LOGIN_COOKIE, "", secure=request.secure, max_age=0, path="/login")
    return response


def logout(ctx: Context, params: dict[str, str]) -> Response:
    assert ctx.session is not None
    ctx.store.delete(ctx.session.id)
    response = redirect("/login")
    response.set_cookie(sessions.SESSION_COOKIE, "", secure=ctx.request.secure, max_age=0)
    return response


def home(ctx: Context, params: dict[str, str]) -> Response:
    return redirect("/repos")


# ---- repositories -----------------------------------------------------------------------


def _can(ctx: Context, action: str, resource: str) -> bool:
    return ctx.session is not None and can(ctx.session, ctx.client, action, resource)


def repositories(ctx: Context, params: dict[str, str]) -> Response:
    page = ctx.client.list_repositories(page_size=SMALL_PAGE, page_token=ctx.request.arg("page"))
    return ctx.render(
        "repositories.html",
        repositories=page.repositories,
        next_page=page.next_page_token,
        can_create=_can(ctx, "fs:CreateRepository", policy.repository_arn("*")),
        can_delete=_can(ctx, "fs:DeleteRepository", policy.repository_arn("*")),
    )


def create_repository(ctx: Context, params: dict[str, str]) -> Response:
    form = ctx.request.form
    name = form.get("name", "").strip()
    ctx.client.create_repository(
        name,
        form.get("storage_namespace", "").strip(),
        default_branch=form.get("default_branch", "").strip() or "main",
    )
    return redirect(_repo_url(name, "objects"))


def confirm_delete_repository(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    require(ctx.session, ctx.client, "fs:DeleteRepository", policy.repository_arn(repo.name))
    return ctx.render("confirm_delete.html", repo=repo, message="")


def delete_repository(ctx: Context, params: dict[str, str]) -> Response:
    name = params["repo"]
    # Never on a click alone: the form must name the repository again.
    if ctx.request.field("confirm") != name:
        repo = ctx.client.get_repository(name)
        return ctx.render(
            "confirm_delete.html",
            400,
            repo=repo,
            message="Type the repository's name exactly to delete it.",
        )
    ctx.client.delete_repository(name)
    return redirect("/repos")


# ---- branches and tags ------------------------------------------------------------------


def _protection(ctx: Context, repo: str) -> list[Any]:
    try:
        return ctx.client.get_branch_protection_rules(repo)[0]
    except errors.QuarryError as exc:
        if exc.code.name == "PERMISSION_DENIED":
            return []
        raise


def _protected(rules: list[Any], branch: str) -> list[str]:
    from fnmatch import fnmatchcase

    from quarry.v1 import branch_manager_pb2 as bm

    names = []
    for rule in rules:
        if fnmatchcase(branch, rule.pattern):
            names += [
                bm.BranchProtectionBlockedAction.Name(a)
                .removeprefix("BRANCH_PROTECTION_BLOCKED_ACTION_")
                .lower()
                for a in rule.blocked_actions
            ]
    return names


def _staging(ctx: Context, repo: str, branch: str, sensor: dict[str, bool]) -> Any:
    """The sensor's counts of a branch, or None. One quick attempt, and none after a
    failure (`sensor["down"]`): a page of 50 branches waited out every call's retries of a
    sensor that was down (7 s each)."""
    if sensor.get("down"):
        return None
    try:
        return ctx.client.branch_staging_stats(repo, branch, quick=True)
    except errors.QuarryError:
        sensor["down"] = True
        return None


def branches(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    page = ctx.client.list_branches(
        repo.name, page_size=SMALL_PAGE, page_token=ctx.request.arg("page")
    )
    rules = _protection(ctx, repo.name)
    rows = []
    sensor: dict[str, bool] = {}
    for branch in page.branches:
        rows.append(
            {
                "branch": branch,
                "dirty": maybe_dirty(branch) and ctx.client.has_uncommitted(repo.name, branch.name),
                "stats": _staging(ctx, repo.name, branch.name, sensor),
                "protection": _protected(rules, branch.name),
                "compacted": bool(branch.compacted_metarange_id),
            }
        )
    return ctx.render(
        "branches.html",
        repo=repo,
        rows=rows,
        next_page=page.next_page_token,
        can_create=_can(ctx, "fs:CreateBranch", policy.branch_arn(repo.name, "*")),
        can_tag=_can(ctx, "fs:CreateTag", policy.tag_arn(repo.name, "*")),
    )


def create_branch(ctx: Context, params: dict[str, str]) -> Response:
    repo = params["repo"]
    name = ctx.request.field("name").strip()
    source = ctx.request.field("source").strip()
    ctx.client.create_branch(repo, name, source or ctx.client.get_repository(repo).default_branch)
    return redirect(url(_repo_url(repo, "objects"), ref=name))


def tags(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    page = ctx.client.list_tags(repo.name, page_size=SMALL_PAGE, page_token=ctx.request.arg("page"))
    return ctx.render(
        "tags.html",
        repo=repo,
        tags=page.tags,
        next_page=page.next_page_token,
        ref=ctx.request.arg("ref") or repo.default_branch,
        can_create=_can(ctx, "fs:CreateTag", policy.tag_arn(repo.name, "*")),
        can_delete=_can(ctx, "fs:DeleteTag", policy.tag_arn(repo.name, "*")),
    )


def create_tag(ctx: Context, params: dict[str, str]) -> Response:
    repo = params["repo"]
    name, ref = required(ctx, "name", "ref")
    ctx.client.create_tag(repo, name, ref)
    return redirect(_repo_url(repo, "tags"))


def confirm_delete_tag(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    tag = ctx.client.get_tag(repo.name, ctx.request.arg("tag"))
    require(ctx.session, ctx.client, "fs:DeleteTag", policy.tag_arn(repo.name, tag.name))
    return confirm_page(
        ctx,
        title=f"Delete tag {tag.name}?",
        action=_repo_url(repo.name, "tags/delete"),
        name=tag.name,
        fields={"tag": tag.name},
        detail=f"The tag points at commit {tag.commit_id}; the commit itself stays.",
        cancel=_repo_url(repo.name, "tags"),
    )


def delete_tag(ctx: Context, params: dict[str, str]) -> Response:
    repo, name = params["repo"], ctx.request.field("tag")
    confirmed(ctx, name)
    ctx.client.delete_tag(repo, name)
    return redirect(_repo_url(repo, "tags"))


# ---- objects ----------------------------------------------------------------------------


def _ref(ctx: Context, repo: Any) -> str:
    return ctx.request.arg("ref") or repo.default_branch


def _is_branch(ctx: Context, repo: Any, ref: str) -> bool:
    """Whether `ref` names a branch (uploads go to branches only: no form on a tag or a
    commit, where the upload would be refused with NOT_A_BRANCH). The default branch is one
    (it cannot be deleted), with no call: most browsing is there. A commit id is not a
    branch name at all (INVALID_NAME)."""
    if ref == repo.default_branch:
        return True
    try:
        ctx.client.get_branch(repo.name, ref)
    except (gerrors.BranchNotFound, errors.InvalidArgument):
        return False
    return True


def objects(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    ref = _ref(ctx, repo)
    prefix = ctx.request.arg("prefix")
    page = ctx.client.list_objects(
        repo.name,
        ref,
        prefix=prefix,
        delimiter="/",
        page_size=PAGE,
        page_token=ctx.request.arg("page"),
    )
    from quarry.console.templates import size, timestamp

    base = _repo_url(repo.name, "")
    # (is a folder, name shown, link, size, modified), in path order; links built here.
    items: list[tuple[str, bool, str, str, str, str]] = [
        (p, True, p[len(prefix) :], url(base + "objects", ref=ref, prefix=p), "", "")
        for p in page.common_prefixes
    ]
    items += [
        (
            e.path,
            False,
            # An object named as its folder (`dir/`, the marker S3 tools and Hadoop make).
            e.path[len(prefix) :] or "./",
            url(base + "object", ref=ref, path=e.path),
            size(e.size_bytes),
            timestamp(e.mtime),
        )
        for e in page.entries
    ]
    items.sort(key=lambda item: item[0])
    crumbs = []
    parts = prefix.split("/")[:-1] if prefix else []
    for i, part in enumerate(parts):
        crumbs.append((part, "/".join(parts[: i + 1]) + "/"))
    return ctx.render(
        "objects.html",
        repo=repo,
        ref=ref,
        prefix=prefix,
        crumbs=crumbs,
        items=items,
        next_page=page.next_page_token,
        can_upload=_can(ctx, "fs:WriteObject", policy.object_arn(repo.name, prefix + "*"))
        and _is_branch(ctx, repo, ref),
    )


class UploadTooLarge(errors.ResourceExhausted):
    reason = "UPLOAD_TOO_LARGE"


def _too_large(limit: int) -> str:
    from quarry.console.templates import size

    return (
        f"The file is larger than the console's upload limit ({size(limit)}, "
        "QUARRY_CONSOLE_MAX_UPLOAD_BYTES): nothing of it was kept or staged."
    )


class _Bounded:
    """The upload's bytes, refused (UPLOAD_TOO_LARGE) once more than `limit` were read."""

    def __init__(self, read: Any, limit: int) -> None:
        self._read = read
        self._left = limit
        self._limit = limit

    def read(self, n: int = -1) -> bytes:
        piece = self._read(n)
        self._left -= len(piece)
        if self._left < 0:
            raise UploadTooLarge(_too_large(self._limit))
        return piece


def upload(ctx: Context, params: dict[str, str]) -> Response:
    """The object browser's upload (a multipart form, its file last): the file's bytes are
    streamed into the repository's storage namespace and its entry staged on the branch
    with the user's token — quarry.uploads, as the s3-gateway's PutObject does.

    Safety: no byte is written before the CSRF token (the app), the user's own policies
    (fs:WriteObject on the object) and the branch were checked; a file over
    QUARRY_CONSOLE_MAX_UPLOAD_BYTES, a refused staging or a dropped connection leaves no
    bytes and no entry (quarry.uploads removes what it wrote)."""
    repo = ctx.client.get_repository(params["repo"])
    branch = ctx.request.field("branch").strip()
    file = ctx.request.upload
    if file is None or not file.filename:
        raise MissingField("choose a file to upload")
    path = ctx.request.field("path").strip().lstrip("/")
    if not path or path.endswith("/"):
        path += file.filename.replace("\\", "/").rsplit("/", 1)[-1]
    limit = int(ctx.console.settings.console_max_upload_bytes)
    declared = ctx.request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + MAX_FORM_BYTES:
        raise UploadTooLarge(_too_large(limit))
    # Asked of the server (Auth/CheckPermission), which audits a refusal as the refused
    # write it is; with auth off there is no Auth service, and nothing to refuse.
    try:
        ctx.client.check_permission("fs:WriteObject", policy.object_arn(repo.name, path))
    except errors.PermissionDenied:
        raise errors.PermissionDenied(
            f"your policies do not allow fs:WriteObject on {path!r} of {repo.name!r}: nothing "
            "was written"
        ) from None
    except errors.Unimplemented:
        pass
    try:
        ctx.client.get_branch(repo.name, branch)
    except errors.QuarryError as exc:
        if exc.code.name in ("NOT_FOUND", "INVALID_ARGUMENT"):
            raise gerrors.NotABranch(
                f"{branch!r} is not a branch of {repo.name!r}: uploads go to branches only"
            ) from None
        raise
    content_type = file.content_type
    if not content_type or content_type == "application/octet-stream":
        content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    uploads.put(
        ctx.client,
        repo,
        branch,
        path,
        _Bounded(file.read, limit).read,
        ctx.console.settings,
        content_type=content_type,
    )
    return redirect(url(_repo_url(repo.name, "changes"), branch=branch))


def object_detail(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    ref, path = _ref(ctx, repo), ctx.request.arg("path")
    entry = ctx.client.stat_object(repo.name, ref, path)
    try:
        confine = confinement(repo.storage_namespace, ctx.console.settings)
        shown = preview.preview(entry, ctx.console.settings, confine)
    except ObjectNotFound:
        shown = preview.Preview("none", note="the object's bytes are missing from storage")
    except AddressNotAllowed:
        shown = preview.Preview("none", note="the object's address leads where it may not be read")
    except errors.QuarryError as exc:
        # Storage unreachable, an address no store can open: the page still shows the entry.
        shown = preview.Preview("none", note=f"no preview: {exc.reason}: {exc.message}")
    return ctx.render(
        "object.html",
        repo=repo,
        ref=ref,
        path=path,
        entry=entry,
        preview=shown,
        content_type=preview.content_type(path, entry.content_type),
    )


def download(ctx: Context, params: dict[str, str]) -> Response:
    repo = params["repo"]
    ref, path = ctx.request.arg("ref"), ctx.request.arg("path")
    entry = ctx.client.stat_object(repo, ref, path)
    namespace = ctx.client.get_repository(repo).storage_namespace
    confine = confinement(namespace, ctx.console.settings)
    opened = open_object(entry.physical_address, ctx.console.settings, confine=confine)
    try:
        reader = opened.__enter__()
    except ObjectNotFound:
        raise errors.NotFound("the object's bytes are missing from storage") from None
    try:
        # A local file of another size: an error page, not a download that breaks off.
        check_stored_size(reader, entry.physical_address, entry.size_bytes, entry.checksum)
    except BaseException:
        _close(opened)
        raise

    name = path.rsplit("/", 1)[-1].replace('"', "")
    ctype, inline = preview.served_type(path, entry.content_type, ctx.request.arg("inline") == "1")
    headers = [
        ("content-type", ctype),
        (
            "content-disposition",
            f"{'inline' if inline else 'attachment'}; filename*=UTF-8''{quote(name)}",
        ),
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", "default-src 'none'; sandbox"),
        ("cache-control", "no-store"),  # a user's data: as every page
    ]
    # Checked as `quarry get` checks (quarry.blob.verified_chunks): a size or SHA-256 that
    # differs from the entry's fails the download (the connection ends before its last
    # bytes), never a saved file of other bytes. An entry whose size is unknown (0, no
    # checksum) is sent without a length: all of its bytes, not an empty file.
    try:
        # A small object's check fails here: an error page, not a download cut at 0 bytes.
        chunks = primed(
            verified_chunks(
                reader,
                entry.physical_address,
                entry.size_bytes,
                entry.checksum,
                DOWNLOAD_CHUNK_BYTES,
            )
        )
    except BaseException:
        _close(opened)
        raise
    if size_recorded(entry.size_bytes, entry.checksum):
        headers.append(("content-length", str(entry.size_bytes)))
    return Response(200, headers, chunks, close=lambda: _close(opened))


def _close(opened: Any) -> None:
    opened.__exit__(None, None, None)


# ---- history ----------------------------------------------------------------------------


def log_page(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    ref = _ref(ctx, repo)
    page = ctx.client.log(repo.name, ref, page_size=LOG_PAGE, page_token=ctx.request.arg("page"))
    rows = graph.layout([(c.id, list(c.parents)) for c in page.commits])
    return ctx.render(
        "log.html",
        repo=repo,
        ref=ref,
        commits=page.commits,
        graph=graph.svg(rows),
        row_height=graph.ROW,
        next_page=page.next_page_token,
    )


def commit_detail(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    commit = ctx.client.get_commit(repo.name, params["commit"])
    changes: list[Any] = []
    next_page = ""
    if commit.parents:
        page = ctx.client.diff(
            repo.name,
            commit.parents[0],
            commit.id,
            page_size=PAGE,
            page_token=ctx.request.arg("page"),
        )
        changes, next_page = list(page.changes), page.next_page_token
    return ctx.render(
        "commit.html",
        repo=repo,
        commit=commit,
        rows=_change_rows(repo.name, commit.id, changes),
        next_page=next_page,
    )


def compare(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    left, right = ctx.request.arg("left"), ctx.request.arg("right")
    three_dot = ctx.request.arg("mode", "three") != "two"
    changes: list[Any] = []
    counts = {"added": 0, "removed": 0, "changed": 0, "conflict": 0}
    next_page = ""
    if left and right:
        page = ctx.client.diff(
            repo.name,
            left,
            right,
            three_dot=three_dot,
            page_size=PAGE,
            page_token=ctx.request.arg("page"),
        )
        changes, next_page = list(page.changes), page.next_page_token
        for change in changes:
            name = CHANGE_NAMES.get(change.type)
            if name in counts:
                counts[name] += 1
    return ctx.render(
        "compare.html",
        repo=repo,
        left=left,
        right=right,
        three_dot=three_dot,
        rows=_change_rows(repo.name, right, changes),
        counts=counts,
        next_page=next_page,
    )


# ---- uncommitted changes, commit, discard, merge ----------------------------------------


def changes(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    branch = ctx.request.arg("branch") or repo.default_branch
    try:
        page = ctx.client.diff_uncommitted(
            repo.name, branch, page_size=PAGE, page_token=ctx.request.arg("page")
        )
    except errors.QuarryError as exc:
        if exc.reason != "NOT_A_BRANCH" or branch == repo.default_branch:
            raise
        # The tab followed while browsing a tag or a commit: only branches have uncommitted
        # changes, so it shows the default branch's.
        return redirect(url(_repo_url(repo.name, "changes"), branch=repo.default_branch), 303)
    return ctx.render(
        "changes.html",
        repo=repo,
        branch=branch,
        rows=_change_rows(repo.name, branch, page.changes),
        next_page=page.next_page_token,
        can_commit=_can(ctx, "fs:CreateCommit", policy.branch_arn(repo.name, branch)),
        can_discard=_can(ctx, "fs:RevertBranch", policy.branch_arn(repo.name, branch)),
    )


def commit(ctx: Context, params: dict[str, str]) -> Response:
    repo, branch = params["repo"], ctx.request.field("branch")
    message = ctx.request.field("message").strip()
    if not message:
        raise errors.InvalidArgument("a commit needs a message")
    made = ctx.client.commit(repo, branch, message)
    return redirect(_repo_url(repo, f"commits/{made.commit.id}"))


def discard(ctx: Context, params: dict[str, str]) -> Response:
    repo, branch = params["repo"], ctx.request.field("branch")
    ctx.client.discard_changes(repo, branch, path=ctx.request.field("path"))
    return redirect(url(_repo_url(repo, "changes"), branch=branch))


def merge_form(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    source, destination = ctx.request.arg("source"), ctx.request.arg("destination")
    strategy = _merge_strategy(ctx.request.arg("strategy"))
    dry = None
    up_to_date = False
    conflicts: list[Any] = []
    more = 0
    if source and destination:
        try:
            dry = ctx.client.merge(
                repo.name, source, destination, strategy=strategy or None, dry_run=True
            )
            conflicts, more = list(dry.conflicts), dry.more_conflicts
        except errors.QuarryError as exc:
            if already_merged(exc):  # as `quarry merge`: "Already up to date", no error
                up_to_date = True
            elif exc.reason == "MERGE_CONFLICT":
                conflicts, more = _conflicts_of(exc)
            else:
                raise
    return ctx.render(
        "merge.html",
        repo=repo,
        source=source,
        destination=destination,
        strategy=strategy,
        dry=dry,
        up_to_date=up_to_date,
        conflicts=conflicts,
        more=more,
        can_merge=bool(destination)
        and _can(ctx, "fs:CreateCommit", policy.branch_arn(repo.name, destination)),
    )


def _merge_strategy(value: str) -> str:
    """A merge strategy's name as given (empty: the default); INVALID_ARGUMENT (400) for
    one that does not exist, before any call."""
    from quarry.graveler.model import MergeStrategy

    try:
        MergeStrategy.parse(value or None)
    except ValueError as exc:
        raise errors.InvalidArgument(str(exc), metadata={"strategy": value[:100]}) from None
    return value


def _conflicts_of(exc: errors.QuarryError) -> tuple[list[Any], int]:
    from quarry.v1 import types_pb2

    for detail in exc.details:
        if detail.Is(types_pb2.MergeConflicts.DESCRIPTOR):
            found = types_pb2.MergeConflicts()
            detail.Unpack(found)
            return list(found.conflicts), found.more
    return [], 0


def merge(ctx: Context, params: dict[str, str]) -> Response:
    repo = params["repo"]
    form = ctx.request.form
    made = ctx.client.merge(
        repo,
        form.get("source", ""),
        form.get("destination", ""),
        strategy=_merge_strategy(form.get("strategy", "")) or None,
        message=form.get("message", ""),
    )
    return redirect(_repo_url(repo, f"commits/{made.commit.id}"))


# ---- actions ----------------------------------------------------------------------------


def action_runs(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    page = ctx.client.list_action_runs(
        repo.name, page_size=SMALL_PAGE, page_token=ctx.request.arg("page")
    )
    return ctx.render("actions.html", repo=repo, runs=page.runs, next_page=page.next_page_token)


def action_run(ctx: Context, params: dict[str, str]) -> Response:
    repo = ctx.client.get_repository(params["repo"])
    run = ctx.client.get_action_run(repo.name, params["run"])
    return ctx.render("action_run.html", repo=repo, run=run)


ROUTES: list[Route] = [
    route("GET", "/_health", "health", health, public=True),
    route("GET", "/login", "login_form", login_form, public=True),
    route("POST", "/login", "login", login, public=True),
    route("POST", "/logout", "logout", logout),
    route("GET", "/", "home", home),
    route("GET", "/repos", "repositories", repositories),
    route("POST", "/repos", "create_repository", create_repository),
    route("GET", "/repos/{repo}/delete", "confirm_delete_repository", confirm_delete_repository),
    route("POST", "/repos/{repo}/delete", "delete_repository", delete_repository),
    route("GET", "/repos/{repo}/branches", "branches", branches),
    route("POST", "/repos/{repo}/branches", "create_branch", create_branch),
    route("GET", "/repos/{repo}/tags", "tags", tags),
    route("POST", "/repos/{repo}/tags", "create_tag", create_tag),
    route("GET", "/repos/{repo}/tags/delete", "confirm_delete_tag", confirm_delete_tag),
    route("POST", "/repos/{repo}/tags/delete", "delete_tag", delete_tag),
    route("GET", "/repos/{repo}/objects", "objects", objects),
    route("POST", "/repos/{repo}/upload", "upload", upload),
    route("GET", "/repos/{repo}/object", "object", object_detail),
    route("GET", "/repos/{repo}/download", "download", download),
    route("GET", "/repos/{repo}/log", "log", log_page),
    route("GET", "/repos/{repo}/commits/{commit}", "commit", commit_detail),
    route("GET", "/repos/{repo}/compare", "compare", compare),
    route("GET", "/repos/{repo}/changes", "changes", changes),
    route("POST", "/repos/{repo}/commit", "commit_post", commit),
    route("POST", "/repos/{repo}/discard", "discard", discard),
    route("GET", "/repos/{repo}/merge", "merge_form", merge_form),
    route("POST", "/repos/{repo}/merge", "merge", merge),
    route("GET", "/repos/{repo}/actions", "action_runs", action_runs),
    route("GET", "/repos/{repo}/actions/{run}", "action_run", action_run),
]

ROUTES += admin.ROUTES
