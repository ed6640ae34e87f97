"""The `quarry` subcommands that talk to a running suite (through quarry.client).

    quarry repo create NAME NAMESPACE [--default-branch B] | list | show NAME | delete NAME [--yes]
    quarry branch create REPO NAME [--source REF] | list REPO | show REPO NAME | delete REPO NAME
    quarry tag create REPO NAME REF | list REPO | show REPO NAME | delete REPO NAME
    quarry put REPO BRANCH PATH --address ADDR [--size N] [--checksum C] [--content-type T]
               [--meta k=v ...] [--if-absent]
    quarry put REPO BRANCH DEST_PREFIX --from LOCAL_FILE_OR_DIR
    quarry rm REPO BRANCH PATH... | --recursive PREFIX
    quarry ls REPO REF [PREFIX] [--recursive]
    quarry stat REPO REF PATH
    quarry commit REPO BRANCH -m MSG [--author A] [--meta k=v ...] [--allow-empty]
    quarry log REPO REF [--first-parent] [-n N] [--oneline]
    quarry diff REPO LEFT RIGHT [--prefix P] | quarry diff REPO BRANCH --uncommitted
    quarry reset REPO BRANCH REF [--force]
    quarry discard REPO BRANCH [--path P | --prefix P]
    quarry compact REPO BRANCH
    quarry stats REPO BRANCH [--compactor-sensor HOST:PORT]
    quarry doctor [REPO] [--kv-gateway HOST:PORT]

Every command takes --branch-manager / --committer (default: the QUARRY_BRANCH_MANAGER_ADDRESS
/ QUARRY_COMMITTER_ADDRESS settings) and --json; `stats` also --compactor-sensor (default:
QUARRY_COMPACTOR_SENSOR_ADDRESS). Failures print one line,
`quarry: <REASON>: <message>`, on stderr and exit with 1.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable

from quarry import errors
from quarry.cli import output
from quarry.cli.progress import Progress, human_bytes
from quarry.client import Client, RetryPolicy
from quarry.v1 import types_pb2

# Interactive use: give up on an unreachable or contended service within seconds.
CLI_RETRY = RetryPolicy(budget=5.0)
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure detected by the CLI itself (not by a service)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---- plumbing --------------------------------------------------------------------------

class Context:
    """Settings, the client and output options of one command run (built lazily)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.json = bool(getattr(args, "json", False))
        self._settings = None
        self._client: Client | None = None

    @property
    def settings(self):
        if self._settings is None:
            from quarry.config import load_settings

            overrides = {}
            if getattr(self.args, "branch_manager", None):
                overrides["branch_manager_address"] = self.args.branch_manager
            if getattr(self.args, "committer", None):
                overrides["committer_address"] = self.args.committer
            if getattr(self.args, "compactor_sensor", None):
                overrides["compactor_sensor_address"] = self.args.compactor_sensor
            self._settings = load_settings(**overrides)
        return self._settings

    @property
    def client(self) -> Client:
        if self._client is None:
            # Listings that skipped corrupt records are shown, with a warning (warn_skipped).
            self._client = Client.from_settings(self.settings, retry=CLI_RETRY,
                                                timeout=self.args.timeout,
                                                allow_incomplete_listings=True)
        return self._client

    def progress(self, label: str, total: int | None = None, unit: str = "") -> Progress:
        forced = bool(getattr(self.args, "progress", False))
        return Progress(label, total, unit=unit, enabled=True if forced else None)

    def warn_skipped(self) -> None:
        """Say so on stderr when a listing left out corrupt records."""
        skipped = self._client.skipped_corrupt_records if self._client is not None else 0
        if skipped:
            print(f"quarry: warning: the server skipped {skipped} corrupt record(s) in this "
                  f"listing (CORRUPT_RECORD); run `quarry doctor` to find them",
                  file=sys.stderr)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fail(reason: str, message: str) -> int:
    print(f"quarry: {reason}: {_one_line(message)}", file=sys.stderr)
    return EXIT_FAILURE


def command(handler: Callable[[argparse.Namespace, Context], int | None]):
    """Run a handler with a Context; every failure becomes one line and exit code 1."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        ctx = Context(args)
        try:
            code = handler(args, ctx) or 0
            ctx.warn_skipped()
            return code
        except errors.QuarryError as exc:
            return fail(exc.reason, exc.message)
        except CliError as exc:
            return fail(exc.reason, exc.message)
        except KeyboardInterrupt:
            print("\nquarry: INTERRUPTED: stopped by the user", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            raise  # main() treats `quarry ls ... | head` as success
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            return fail("LOCAL_IO_ERROR", f"{exc.strerror or exc}{where}")
        except Exception as exc:  # noqa: BLE001 — a bug; still no traceback for users
            if os.environ.get("QUARRY_CLI_TRACEBACK"):
                raise
            return fail("INTERNAL", f"{type(exc).__name__}: {exc} "
                                    "(set QUARRY_CLI_TRACEBACK=1 for details)")
        finally:
            ctx.close()

    return run


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument("--branch-manager", metavar="HOST:PORT",
                       help="branch-manager address (default: QUARRY_BRANCH_MANAGER_ADDRESS)")
    group.add_argument("--committer", metavar="HOST:PORT",
                       help="committer address (default: QUARRY_COMMITTER_ADDRESS)")
    group.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                       help="deadline of each call (default: 30)")
    group.add_argument("--json", action="store_true", help="machine-readable JSON output")
    return common


def _progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true",
                        help="draw progress on stderr even when it is not a terminal")


# ---- repositories ----------------------------------------------------------------------

@command
def repo_create(args, ctx):
    repo = ctx.client.create_repository(args.name, args.namespace, args.default_branch)
    if ctx.json:
        output.print_json(repo)
    else:
        print(f"Created repository {repo.name} (default branch {repo.default_branch}, "
              f"storage {repo.storage_namespace})")


@command
def repo_list(args, ctx):
    repos = list(ctx.client.iter_repositories())
    if ctx.json:
        output.print_json(repos)
        return
    output.table(["NAME", "DEFAULT BRANCH", "STORAGE NAMESPACE", "CREATED"],
                 [(r.name, r.default_branch, r.storage_namespace,
                   output.timestamp_text(r.creation_time)) for r in repos])


@command
def repo_show(args, ctx):
    repo = ctx.client.get_repository(args.name)
    if ctx.json:
        output.print_json(repo)
        return
    output.fields([("name", repo.name), ("storage namespace", repo.storage_namespace),
                   ("default branch", repo.default_branch),
                   ("created", output.timestamp_text(repo.creation_time))])


def _confirm(question: str, flag: str) -> None:
    if not sys.stdin.isatty():
        raise CliError("CONFIRMATION_REQUIRED", f"{question} Pass {flag} to confirm.")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("CANCELLED", "nothing was deleted")


@command
def repo_delete(args, ctx):
    if not args.yes:
        _confirm(f"Delete repository {args.name!r} and all its branches, tags and "
                 f"history?", "--yes")
    ctx.client.delete_repository(args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted repository {args.name}")


# ---- branches --------------------------------------------------------------------------

def _dirty_text(branch: types_pb2.Branch) -> str:
    # An absent flag (records older than the field) reads as dirty.
    return "yes" if (not branch.HasField("dirty") or branch.dirty) else "no"


@command
def branch_create(args, ctx):
    branch = ctx.client.create_branch(args.repo, args.name, args.source or "")
    if ctx.json:
        output.print_json(branch)
    else:
        source = f" from {args.source}" if args.source else ""
        print(f"Created branch {branch.name}{source} at {output.short_id(branch.commit_id)}")


@command
def branch_list(args, ctx):
    branches = list(ctx.client.iter_branches(args.repo))
    if ctx.json:
        output.print_json(branches)
        return
    output.table(["NAME", "COMMIT", "UNCOMMITTED"],
                 [(b.name, output.short_id(b.commit_id), _dirty_text(b)) for b in branches])


@command
def branch_show(args, ctx):
    branch = ctx.client.get_branch(args.repo, args.name)
    if ctx.json:
        output.print_json(branch)
        return
    rows = [("name", branch.name), ("commit", branch.commit_id or "-"),
            ("uncommitted changes", _dirty_text(branch)),
            ("staging token", branch.staging_token or "-"),
            ("sealed tokens", ", ".join(branch.sealed_tokens) or "-")]
    if branch.compacted_metarange_id:
        rows.append(("compacted metarange", branch.compacted_metarange_id))
    output.fields(rows)


@command
def branch_delete(args, ctx):
    ctx.client.delete_branch(args.repo, args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted branch {args.name}")


# ---- tags ------------------------------------------------------------------------------

@command
def tag_create(args, ctx):
    tag = ctx.client.create_tag(args.repo, args.name, args.ref)
    if ctx.json:
        output.print_json(tag)
    else:
        print(f"Created tag {tag.name} at {output.short_id(tag.commit_id)}")


@command
def tag_list(args, ctx):
    tags = list(ctx.client.iter_tags(args.repo))
    if ctx.json:
        output.print_json(tags)
        return
    output.table(["NAME", "COMMIT"], [(t.name, t.commit_id) for t in tags])


@command
def tag_show(args, ctx):
    tag = ctx.client.get_tag(args.repo, args.name)
    if ctx.json:
        output.print_json(tag)
        return
    output.fields([("name", tag.name), ("commit", tag.commit_id)])


@command
def tag_delete(args, ctx):
    ctx.client.delete_tag(args.repo, args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted tag {args.name}")


# ---- objects ---------------------------------------------------------------------------

@command
def put(args, ctx):
    metadata = dict(args.meta or [])
    if args.source is not None:
        return _put_from(args, ctx, metadata)
    if not args.address:
        raise CliError("INVALID_ARGUMENT", "put needs --address ADDR (an object already in "
                                           "storage) or --from LOCAL_FILE_OR_DIR (upload)")
    entry = ctx.client.put_object(
        args.repo, args.branch, path=args.path, physical_address=args.address,
        size_bytes=args.size, checksum=args.checksum, content_type=args.content_type,
        metadata=metadata, mtime=_dt.datetime.now(_dt.timezone.utc),
        if_absent=args.if_absent)
    if ctx.json:
        output.print_json(entry)
    else:
        print(f"Staged {entry.path} on {args.repo}/{args.branch}")


def _put_from(args, ctx, metadata: dict[str, str]) -> int:
    from quarry.blob import open_blob_store
    from quarry.cli import upload

    if args.address:
        raise CliError("INVALID_ARGUMENT", "--address and --from exclude each other")
    source = Path(args.source)
    items = upload.plan(source, args.path)
    if not items:
        raise CliError("NOTHING_TO_UPLOAD", f"no files under {source}")
    if args.if_absent and len(items) != 1:
        raise CliError("INVALID_ARGUMENT", "--if-absent applies to a single file")
    client = ctx.client
    repo = client.get_repository(args.repo)
    # Fail on a missing branch before any bytes move.
    client.get_branch(args.repo, args.branch)
    store = open_blob_store(repo.storage_namespace, ctx.settings)
    try:
        if len(items) == 1:
            (entry,) = upload.upload_all(store, repo.storage_namespace, items,
                                         args.content_type, metadata)
            staged = client.put_object(args.repo, args.branch, entry,
                                       if_absent=args.if_absent)
            entries, count = [staged], 1
        else:
            with ctx.progress("uploading", total=len(items), unit="files") as bar:
                entries = list(upload.upload_all(store, repo.storage_namespace, items,
                                                 args.content_type, metadata,
                                                 on_done=lambda _e: bar.advance()))
            with ctx.progress("staging", total=len(entries), unit="entries") as bar:
                count = client.put_objects(args.repo, args.branch, entries,
                                           progress=bar.update)
    finally:
        store.close()
    total_bytes = sum(e.size_bytes for e in entries)
    if ctx.json:
        output.print_json({"staged": count, "bytes": total_bytes,
                           "entries": [output.to_jsonable(e) for e in entries]})
    else:
        files = "file" if len(entries) == 1 else "files"
        where = entries[0].path if len(entries) == 1 else (args.path.strip("/") + "/"
                                                           if args.path.strip("/") else "/")
        print(f"Uploaded {len(entries)} {files} ({human_bytes(total_bytes)}) to "
              f"{args.repo}/{args.branch}: {where}")
    return 0


@command
def rm(args, ctx):
    client = ctx.client
    paths = list(args.paths)
    if args.recursive is None and not paths:
        raise CliError("INVALID_ARGUMENT", "name the paths to remove, or --recursive PREFIX")
    if args.recursive is not None:
        with ctx.progress("listing", unit="objects") as bar:
            for entry in client.iter_objects(args.repo, args.branch, prefix=args.recursive):
                paths.append(entry.path)
                bar.advance()
    requested = len(set(paths))
    if not paths:
        deleted = 0
    else:
        with ctx.progress("removing", total=len(paths), unit="paths") as bar:
            deleted = client.delete_objects(args.repo, args.branch, paths,
                                            progress=bar.update)
    if ctx.json:
        output.print_json({"removed": deleted, "requested": requested})
    else:
        noun = "object" if deleted == 1 else "objects"
        missing = requested - deleted
        extra = f" ({missing} did not exist)" if missing else ""
        print(f"Removed {deleted} {noun} from {args.repo}/{args.branch}{extra}")


LS_FORMAT = "{mtime:<20}  {size:>12}  {path}"


@command
def ls(args, ctx):
    delimiter = "" if args.recursive else "/"
    pages = ctx.client.iter_object_pages(args.repo, args.ref, prefix=args.prefix,
                                         delimiter=delimiter, page_size=args.page_size)
    if ctx.json:
        entries, prefixes = [], []
        for page in pages:
            entries.extend(output.to_jsonable(e) for e in page.entries)
            prefixes.extend(page.common_prefixes)
        output.print_json({"entries": entries, "common_prefixes": prefixes})
        return
    out = sys.stdout
    out.write(LS_FORMAT.format(mtime="MODIFIED", size="SIZE", path="PATH") + "\n")
    # Only long listings get a counter: it appears from the second page on.
    bar = ctx.progress("listing", unit="entries") if args.recursive else None
    listed = 0
    for number, page in enumerate(pages):
        if bar is not None:
            bar.clear()
        items = sorted([(p, None) for p in page.common_prefixes] +
                       [(e.path, e) for e in page.entries], key=lambda item: item[0])
        for path, entry in items:
            if entry is None:
                out.write(LS_FORMAT.format(mtime="", size="PRE", path=path) + "\n")
            else:
                out.write(LS_FORMAT.format(mtime=output.timestamp_text(entry.mtime),
                                           size=entry.size_bytes, path=path) + "\n")
        listed += len(items)
        if bar is not None and page.next_page_token:
            out.flush()
            bar.update(listed)
    if bar is not None:
        bar.clear()


@command
def stat(args, ctx):
    entry = ctx.client.stat_object(args.repo, args.ref, args.path)
    if ctx.json:
        output.print_json(entry)
        return
    output.fields([("path", entry.path), ("physical address", entry.physical_address),
                   ("size", f"{entry.size_bytes} ({human_bytes(entry.size_bytes)})"),
                   ("checksum", entry.checksum or "-"),
                   ("modified", output.timestamp_text(entry.mtime)),
                   ("content type", entry.content_type or "-"),
                   ("metadata", output.metadata_text(entry.metadata))])


# ---- history ---------------------------------------------------------------------------

@command
def commit(args, ctx):
    response = ctx.client.commit(args.repo, args.branch, args.message,
                                 args.author or _default_author(),
                                 dict(args.meta or []), args.allow_empty)
    if ctx.json:
        output.print_json(response)
        return
    summary = response.summary
    print(f"[{args.branch} {output.short_id(response.commit.id)}] {response.commit.message}")
    print(f" {summary.added} added, {summary.removed} removed, {summary.changed} changed")


def _print_commit(c: types_pb2.Commit, oneline: bool) -> None:
    if oneline:
        first = c.message.splitlines()[0] if c.message else ""
        print(f"{output.short_id(c.id)} {first}")
        return
    print(f"commit {c.id}")
    if len(c.parents) > 1:
        print("Merge:  " + " ".join(output.short_id(p) for p in c.parents))
    print(f"Author: {c.committer or '-'}")
    print(f"Date:   {output.timestamp_text(c.creation_time)}")
    if c.metadata:
        print(f"Meta:   {output.metadata_text(c.metadata)}")
    print()
    for line in (c.message or "").splitlines() or [""]:
        print(f"    {line}".rstrip())
    print()


@command
def log(args, ctx):
    commits = ctx.client.iter_log(args.repo, args.ref, first_parent=args.first_parent,
                                  limit=args.n)
    if ctx.json:
        output.print_json(list(commits))
        return
    for c in commits:
        _print_commit(c, args.oneline)


@command
def diff(args, ctx):
    client = ctx.client
    if args.uncommitted:
        if args.right:
            raise CliError("INVALID_ARGUMENT", "diff --uncommitted takes one branch: "
                                               "quarry diff REPO BRANCH --uncommitted")
        changes = client.iter_uncommitted(args.repo, args.left, prefix=args.prefix)
    else:
        if not args.right:
            raise CliError("INVALID_ARGUMENT", "diff needs LEFT and RIGHT refs (or BRANCH "
                                               "--uncommitted)")
        changes = client.iter_diff(args.repo, args.left, args.right, prefix=args.prefix,
                                   three_dot=args.three_dot)
    if ctx.json:
        output.print_json(list(changes))
        return
    shown = 0
    for change in changes:
        print(f"{output.CHANGE_MARKS.get(change.type, '?')} {change.path}")
        shown += 1
    if shown == 0 and sys.stderr.isatty():
        print("no changes", file=sys.stderr)


@command
def merge(args, ctx):
    response = ctx.client.merge(args.repo, args.source, args.destination,
                                strategy=args.strategy, message=args.message or "",
                                committer=args.author or _default_author(),
                                metadata=dict(args.meta or []), squash=args.squash,
                                allow_empty=args.allow_empty, dry_run=args.dry_run)
    if ctx.json:
        output.print_json(response)
        return
    summary = response.summary
    counts = f"{summary.added} added, {summary.removed} removed, {summary.changed} changed"
    if args.dry_run:
        print(f"Dry run: merging {args.source} into {args.destination} would make {counts}")
        for conflict in response.conflicts:
            print(f"! {conflict.path}")
        if response.conflicts:
            print(f"{len(response.conflicts)} conflict(s)")
        return
    print(f"[{args.destination} {output.short_id(response.commit.id)}] "
          f"{response.commit.message}")
    print(f" {counts} (attempts: {response.attempts})")


def _print_new_commit(branch: str, commit: types_pb2.Commit, ctx) -> None:
    if ctx.json:
        output.print_json(commit)
    else:
        print(f"[{branch} {output.short_id(commit.id)}] {commit.message}")


@command
def revert(args, ctx):
    commit = ctx.client.revert(args.repo, args.branch, args.ref, args.parent,
                               args.message or "", args.author or _default_author())
    _print_new_commit(args.branch, commit, ctx)


@command
def cherry_pick(args, ctx):
    commit = ctx.client.cherry_pick(args.repo, args.branch, args.ref, args.parent,
                                    args.message or "", args.author or "")
    _print_new_commit(args.branch, commit, ctx)


@command
def reset(args, ctx):
    branch = ctx.client.reset_branch(args.repo, args.branch, args.ref, args.force)
    if ctx.json:
        output.print_json(branch)
    else:
        print(f"Reset {args.repo}/{branch.name or args.branch} to "
              f"{output.short_id(branch.commit_id)}")


@command
def discard(args, ctx):
    ctx.client.discard_changes(args.repo, args.branch, path=args.path or "",
                               prefix=args.prefix or "")
    what = (f"path {args.path}" if args.path else f"prefix {args.prefix}" if args.prefix
            else "everything")
    if ctx.json:
        output.print_json({"discarded": what})
    else:
        print(f"Discarded uncommitted changes on {args.repo}/{args.branch} ({what})")


# ---- staging compaction ------------------------------------------------------------------

@command
def compact(args, ctx):
    response = ctx.client.compact(args.repo, args.branch)
    if ctx.json:
        output.print_json(response)
        return
    if response.tokens_compacted:
        print(f"Compacted {args.repo}/{args.branch}: {response.tokens_compacted} staging "
              f"token(s) into metarange {response.compacted_metarange_id}")
    else:
        print(f"Nothing to compact on {args.repo}/{args.branch} (compacted metarange: "
              f"{response.compacted_metarange_id or 'none'})")


@command
def stats(args, ctx):
    response = ctx.client.branch_staging_stats(args.repo, args.branch)
    if ctx.json:
        output.print_json(response)
        return
    output.fields([("branch", f"{args.repo}/{args.branch}"),
                   ("staged entries", str(response.puts)),
                   ("staged tombstones", str(response.deletes)),
                   ("sealed tokens", str(response.sealed_tokens)),
                   ("last compaction", output.timestamp_text(
                       response.last_compaction if response.HasField("last_compaction")
                       else None, empty="never"))])


# ---- garbage collection ------------------------------------------------------------------

def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("days may not be negative")
    return value


def _branch_days(text: str) -> tuple[str, float]:
    branch, value = key_value(text)
    return branch, _days(value)


def _gc_rules(args, base):
    """`base` (a RetentionRules) with a rules file and the day flags applied on top."""
    from quarry.retention import RetentionRules

    rules = base
    if args.rules:
        with open(args.rules, encoding="utf-8") as fh:
            rules = RetentionRules.from_json(fh.read())
    return RetentionRules(
        args.retention_days if args.retention_days is not None else rules.default_retention_days,
        {**rules.branch_retention_days, **dict(args.branch_retention or [])})


@command
def gc_set_rules(args, ctx):
    from quarry.retention import RetentionRules

    if not (args.rules or args.retention_days is not None or args.branch_retention):
        raise CliError("INVALID_ARGUMENT", "give --rules FILE, --retention-days or "
                                           "--branch-retention")
    rules = _gc_rules(args, RetentionRules())
    ctx.client.set_gc_rules(args.repo, rules.default_retention_days,
                            rules.branch_retention_days)
    _print_rules(ctx, args.repo, rules)


@command
def gc_show_rules(args, ctx):
    from quarry.retention import RetentionRules

    _print_rules(ctx, args.repo, RetentionRules.from_proto(ctx.client.get_gc_rules(args.repo)))


def _print_rules(ctx, repo: str, rules) -> None:
    if ctx.json:
        output.print_json(json.loads(rules.to_json()))
        return
    pairs = [("repository", repo), ("default retention", f"{rules.default_retention_days:g} days")]
    for branch, days in sorted(rules.branch_retention_days.items()):
        pairs.append((f"branch {branch}", f"{days:g} days"))
    output.fields(pairs)


@command
def gc_delete_rules(args, ctx):
    ctx.client.delete_gc_rules(args.repo)
    if ctx.json:
        output.print_json({"deleted": args.repo})
        return
    print(f"Deleted the garbage-collection rules of {args.repo} (GC now keeps 21 days)")


@command
def gc_run(args, ctx):
    try:
        from quarry.spark.gc import collect_garbage, stored_rules
        from quarry.spark.session import local_session
    except ImportError as exc:
        raise CliError("SPARK_NOT_INSTALLED", f"quarry gc needs PySpark ({exc}); install "
                                              f"quarry[spark]") from None
    from quarry.spark.common import Connection

    if bool(args.repo) == bool(args.all):
        raise CliError("INVALID_ARGUMENT", "give a repository or --all")
    now = None
    if args.now:
        try:
            now = _dt.datetime.fromisoformat(args.now)
        except ValueError:
            raise CliError("INVALID_ARGUMENT", f"--now: not an ISO time: {args.now!r}") from None
        now = now if now.tzinfo else now.replace(tzinfo=_dt.timezone.utc)
    repositories = [args.repo] if args.repo else [r.name for r in
                                                  ctx.client.iter_repositories()]
    # Rules are checked for every repository before Spark starts (a bad flag fails fast).
    rules = {repo: _gc_rules(args, stored_rules(ctx.client, repo)) for repo in repositories}
    connection = Connection.from_settings(ctx.settings)
    spark = local_session(args.master, "quarry-gc")
    reports, failures = [], []
    for repo in repositories:
        try:
            report = collect_garbage(
                spark, repo, rules=rules[repo], sweep=args.sweep, now=now,
                grace=_dt.timedelta(hours=args.grace_hours),
                ephemeral_ttl=_dt.timedelta(hours=args.ephemeral_ttl_hours),
                connection=connection)
        except errors.QuarryError as exc:
            if not args.all:
                raise
            failures.append(repo)  # the other repositories are still collected
            fail(exc.reason, f"{repo}: {exc.message}")
            continue
        reports.append(report)
        if not ctx.json:
            _print_gc_report(report)
    if ctx.json:
        output.print_json(reports[0].to_dict() if args.repo else
                          [report.to_dict() for report in reports])
    return EXIT_FAILURE if failures else 0


def _print_gc_report(report) -> None:
    output.fields([("repository", report.repository),
                   ("mode", "sweep" if report.sweep else "dry run (nothing deleted)"),
                   ("commits", f"{report.commits_retained} retained, "
                               f"{report.commits_expired} expired"),
                   ("stale Spark branches", ", ".join(report.ephemeral_branches) or "none"),
                   ("objects scanned", f"{report.objects_scanned} ({report.objects_in_grace} "
                                       f"younger than the grace period)"),
                   ("report", f"{report.storage_namespace.rstrip('/')}/{report.report_key}")])
    output.table(["KIND", "COLLECTABLE", "BYTES"],
                 [(kind, part.count, part.bytes) for kind, part in report.collectable.items()],
                 right=(1, 2))
    if report.sweep:
        print(f"Deleted {report.deleted} objects.")
    elif report.collectable_count:
        print(f"Run again with --sweep to delete these {report.collectable_count} objects.")


# ---- doctor ----------------------------------------------------------------------------

@command
def doctor(args, ctx):
    """Read-only: corrupt records and dangling references (see quarry.doctor)."""
    from quarry import doctor as checkup
    from quarry.blob import open_blob_store
    from quarry.kv.remote import RemoteStore

    store = RemoteStore(args.kv_gateway or ctx.settings.kv_gateway_address,
                        timeout=args.timeout)
    try:
        report = checkup.Doctor(store, lambda ns: open_blob_store(ns, ctx.settings),
                                lambda: checkup.gateway_staging_partitions(store)
                                ).check(args.repo or "")
    finally:
        store.close()
    if ctx.json:
        output.print_json(report.to_json())
    else:
        for finding in report.findings:
            print(f"{finding.kind}: {finding.where()}: {finding.message}")
        for note in report.notes:
            print(f"note: {note}")
        checked = ", ".join(f"{n} {what}" for what, n in report.checked.items())
        verdict = "no problems found" if report.ok else f"{len(report.findings)} problem(s)"
        print(f"{verdict} (checked {checked or 'nothing'})")
    return 0 if report.ok else EXIT_FAILURE


# ---- the parser ------------------------------------------------------------------------

def _gc_rule_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--rules", metavar="FILE", help="retention rules in lakeFS's JSON format "
                   "({\"default_retention_days\": 21, \"branches\": [{\"branch_id\": ..., "
                   "\"retention_days\": ...}]})")
    p.add_argument("--retention-days", type=_days, metavar="DAYS",
                   help=f"keep commits this recent {default}")
    p.add_argument("--branch-retention", action="append", type=_branch_days,
                   metavar="BRANCH=DAYS", help="a branch's own retention (repeatable)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the client subcommands to the `quarry` parser's subparsers."""
    common = _common_options()

    def leaf(parent, name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, help=help_text, description=help_text,
                                   parents=[common])
        parser.set_defaults(func=handler)
        return parser

    def group(name: str, help_text: str):
        parser = sub.add_parser(name, help=help_text, description=help_text)
        return parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    repo = group("repo", "create, list, show and delete repositories")
    p = leaf(repo, "create", repo_create, "create a repository")
    p.add_argument("name", metavar="NAME")
    p.add_argument("namespace", help="storage namespace: /abs/dir, file:///abs/dir or "
                                     "s3://bucket/prefix", metavar="NAMESPACE")
    p.add_argument("--default-branch", default="main", metavar="B")
    leaf(repo, "list", repo_list, "list repositories")
    p = leaf(repo, "show", repo_show, "show a repository")
    p.add_argument("name", metavar="NAME")
    p = leaf(repo, "delete", repo_delete, "delete a repository")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    branch = group("branch", "create, list, show and delete branches")
    p = leaf(branch, "create", branch_create, "create a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--source", metavar="REF", help="where it starts (default: the "
                                                   "repository's default branch)")
    p = leaf(branch, "list", branch_list, "list branches")
    p.add_argument("repo", metavar="REPO")
    p = leaf(branch, "show", branch_show, "show a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p = leaf(branch, "delete", branch_delete, "delete a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")

    tag = group("tag", "create, list, show and delete tags")
    p = leaf(tag, "create", tag_create, "create a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p.add_argument("ref", metavar="REF")
    p = leaf(tag, "list", tag_list, "list tags")
    p.add_argument("repo", metavar="REPO")
    p = leaf(tag, "show", tag_show, "show a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p = leaf(tag, "delete", tag_delete, "delete a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")

    p = leaf(sub, "put", put, "stage an object already in storage (--address), or upload "
                              "local files into the repository's storage (--from)")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("path", help="object path; with --from, the destination (a directory's "
                                "files go under PATH/)", metavar="PATH")
    p.add_argument("--address", metavar="ADDR", help="physical address of the object")
    p.add_argument("--from", dest="source", metavar="LOCAL_FILE_OR_DIR",
                   help="upload this file or directory")
    p.add_argument("--size", type=int, default=0, metavar="N", help="size in bytes")
    p.add_argument("--checksum", default="", metavar="C")
    p.add_argument("--content-type", default="", metavar="T")
    p.add_argument("--meta", action="append", type=key_value, metavar="K=V",
                   help="user metadata (repeatable)")
    p.add_argument("--if-absent", action="store_true",
                   help="fail if the path already has an entry")
    _progress_option(p)

    p = leaf(sub, "rm", rm, "stage the removal of objects")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--recursive", "-r", metavar="PREFIX",
                   help="remove every object under PREFIX")
    _progress_option(p)

    p = leaf(sub, "ls", ls, "list objects on a ref")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    p.add_argument("--recursive", "-r", action="store_true",
                   help="every object under the prefix (no '/' grouping)")
    p.add_argument("--page-size", type=int, default=0, metavar="N",
                   help="entries per request (default: the server's)")
    _progress_option(p)

    p = leaf(sub, "stat", stat, "show an object's entry")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("path", metavar="PATH")

    p = leaf(sub, "commit", commit, "commit a branch's staged changes")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("-m", "--message", required=True)
    p.add_argument("--author", metavar="A",
                   help="the committer recorded in the commit (default: your user name)")
    p.add_argument("--meta", action="append", type=key_value, metavar="K=V",
                   help="commit metadata (repeatable)")
    p.add_argument("--allow-empty", action="store_true")

    p = leaf(sub, "log", log, "show commit history")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--first-parent", action="store_true")
    p.add_argument("-n", type=int, default=None, metavar="N", help="at most N commits")
    p.add_argument("--oneline", action="store_true", help="one short line per commit")

    p = leaf(sub, "diff", diff, "changes between two refs, or a branch's uncommitted "
                                "changes")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("left", metavar="LEFT|BRANCH")
    p.add_argument("right", metavar="RIGHT", nargs="?")
    p.add_argument("--prefix", default="", metavar="P")
    p.add_argument("--uncommitted", action="store_true",
                   help="uncommitted changes of BRANCH")
    p.add_argument("--three-dot", action="store_true",
                   help="changes on RIGHT since the merge base (! = changed on both sides)")

    p = leaf(sub, "merge", merge, "merge a ref into a branch (three-way)")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("source", metavar="SOURCE_REF")
    p.add_argument("destination", metavar="DEST_BRANCH")
    p.add_argument("--strategy", choices=["source-wins", "dest-wins"], default=None,
                   help="resolve conflicts for one side (default: conflicts fail)")
    p.add_argument("-m", "--message", default="")
    p.add_argument("--author", metavar="A")
    p.add_argument("--meta", action="append", type=key_value, metavar="K=V")
    p.add_argument("--squash", action="store_true", help="one parent: the destination")
    p.add_argument("--allow-empty", action="store_true")
    p.add_argument("--dry-run", action="store_true",
                   help="report the summary and conflicts without committing")

    for name, handler, help_text in (
            ("revert", revert, "commit the inverse of a commit onto a branch"),
            ("cherry-pick", cherry_pick, "commit a commit's change onto a branch")):
        p = leaf(sub, name, handler, help_text)
        p.add_argument("repo", metavar="REPO")
        p.add_argument("branch", metavar="BRANCH")
        p.add_argument("ref", metavar="REF")
        p.add_argument("--parent", type=int, default=0, metavar="N",
                       help="for a merge commit: the parent (1-based) to compare against")
        p.add_argument("-m", "--message", default="")
        p.add_argument("--author", metavar="A")

    p = leaf(sub, "reset", reset, "hard-reset a branch to a ref")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--force", action="store_true",
                   help="also drop uncommitted changes")

    p = leaf(sub, "discard", discard, "discard uncommitted changes of a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--path", metavar="P", help="one path only")
    scope.add_argument("--prefix", metavar="P", help="paths under a prefix only")

    p = leaf(sub, "compact", compact, "compact a branch's staged changes now (the "
                                      "compactor-sensor also does it past its thresholds)")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")

    p = leaf(sub, "stats", stats, "a branch's staging statistics, as the compactor-sensor "
                                  "counts them")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("--compactor-sensor", metavar="HOST:PORT",
                   help="compactor-sensor address (default: QUARRY_COMPACTOR_SENSOR_ADDRESS)")

    p = leaf(sub, "doctor", doctor, "read-only check: corrupt records and dangling "
                                    "references (exit 1 if any)")
    p.add_argument("repo", metavar="REPO", nargs="?",
                   help="check only this repository (default: everything, with the cleanup "
                        "queue and orphan staging tokens)")
    p.add_argument("--kv-gateway", metavar="HOST:PORT",
                   help="kv-gateway address (default: QUARRY_KV_GATEWAY_ADDRESS)")

    gc = group("gc", "garbage collection of storage namespaces, and its retention rules")
    p = leaf(gc, "run", gc_run, "garbage-collect a repository's storage namespace (a Spark "
                                "job): expired commits' data, orphaned ranges and metaranges, "
                                "stale Spark branches; a dry run unless --sweep")
    p.add_argument("repo", metavar="REPO", nargs="?")
    p.add_argument("--all", action="store_true",
                   help="every repository, one after another (exit 1 if any failed)")
    p.add_argument("--sweep", action="store_true", help="delete (default: only report)")
    _gc_rule_options(p, "(default: the repository's rules, else 21 days)")
    p.add_argument("--grace-hours", type=float, default=6.0, metavar="H",
                   help="never delete objects younger than this (default: 6)")
    p.add_argument("--ephemeral-ttl-hours", type=float, default=24.0, metavar="H",
                   help="Spark write branches older than this are stale (default: 24)")
    p.add_argument("--now", metavar="ISO_TIME",
                   help="measure retention from this time instead of now")
    p.add_argument("--master", default="local[*]", metavar="URL",
                   help="Spark master (default: local[*])")
    p = leaf(gc, "set-rules", gc_set_rules, "store a repository's retention rules")
    p.add_argument("repo", metavar="REPO")
    _gc_rule_options(p, "(default: 21)")
    p = leaf(gc, "show-rules", gc_show_rules, "show a repository's retention rules")
    p.add_argument("repo", metavar="REPO")
    p = leaf(gc, "delete-rules", gc_delete_rules, "delete a repository's retention rules")
    p.add_argument("repo", metavar="REPO")


__all__ = ["register", "command", "CliError", "Context"]


def _default_author() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 — no user database entry (containers)
        return ""
