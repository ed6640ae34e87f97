"""`quarry store export` and `quarry store import`: the KV data of every repository to and from a
JSON-lines file, read and written on the KV backend itself (the services stopped)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import quarry
from quarry import errors
from quarry.cli.base import Subparsers
from quarry.config import load_settings


def _open_kv(url: str | None, must_exist: bool) -> Any:
    """The KV backend itself (not the gateway): the services should be stopped."""
    import urllib.parse

    from quarry.kv import ThrottleRetry, open_store

    settings = load_settings()
    url = url or settings.effective_kv_url
    parsed = urllib.parse.urlsplit(url)
    if must_exist and parsed.scheme.lower() == "sqlite":
        path = urllib.parse.unquote(parsed.netloc + parsed.path)
        if path and not os.path.exists(path):
            raise errors.NotFound(f"no KV store at {path}")
    return open_store(url, ThrottleRetry.from_settings(settings))


def _progress(verb: str) -> Callable[[int], None]:
    def report(count: int) -> None:
        print(f"  {verb} {count} items...", file=sys.stderr, flush=True)

    return report


def _transfer(name: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except errors.QuarryError as exc:
        message = " ".join(exc.message.split())
        print(f"quarry {name}: {exc.reason}: {message}", file=sys.stderr)
    except OSError as exc:
        print(f"quarry {name}: {exc}", file=sys.stderr)
    except UnicodeDecodeError:
        print(f"quarry {name}: CORRUPT_EXPORT: the file is not UTF-8 text", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\nquarry {name}: interrupted", file=sys.stderr)
    return 1


def cmd_export(args: argparse.Namespace) -> int:
    from quarry import exporting

    def run() -> int:
        store = _open_kv(args.kv_url, must_exist=True)
        target = Path(args.file)
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)  # so the mode below is the file's
        try:
            # Private: it holds the users' password hashes and sealed S3 secrets.
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "w", encoding="utf-8") as out:
                summary = exporting.export_store(store, out, _progress("exported"))
            os.replace(partial, target)
        finally:
            store.close()
            partial.unlink(missing_ok=True)
        print(
            f"exported {summary.repositories} repositories, {summary.items} items "
            f"(storage format {summary.format_version or 'unstamped'}) to {target}",
            file=sys.stderr,
        )
        for problem in summary.unreadable:
            print(f"quarry store export: CORRUPT_RECORD: {problem}", file=sys.stderr)
        return 1 if summary.unreadable else 0

    return _transfer("store export", run)


def cmd_import(args: argparse.Namespace) -> int:
    from quarry import exporting
    from quarry.blob import open_blob_store

    def run() -> int:
        settings = load_settings()
        with open(args.file, encoding="utf-8") as lines:
            store = _open_kv(args.kv_url, must_exist=False)
            try:
                summary = exporting.import_store(
                    store,
                    lines,
                    _progress("imported"),
                    open_namespace=lambda namespace: open_blob_store(namespace, settings),
                )
            finally:
                store.close()
        print(
            f"imported {summary.repositories} repositories, {summary.items} items "
            f"(exported from storage format {summary.format_version or 'unstamped'}; "
            f"stamped {quarry.FORMAT_VERSION})",
            file=sys.stderr,
        )
        if summary.identities_skipped:
            print(
                f"not imported: {summary.identities_skipped} identity records (users, "
                f"credentials, groups, policies): the target store has its own",
                file=sys.stderr,
            )
        if summary.metaranges_rewritten:
            print(
                f"rebuilt committed data in storage format {quarry.FORMAT_VERSION}: "
                f"{summary.ranges_rewritten} ranges, {summary.metaranges_rewritten} "
                f"metaranges rewritten; {summary.merge_hints_dropped} merge hints dropped",
                file=sys.stderr,
            )
        return 0

    return _transfer("store import", run)


KV_HELP = "KV store URL (default: the settings' KV URL, QUARRY_KV_URL / QUARRY_HOME)"


def register_store(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    store = sub.add_parser(
        "store",
        help="dump or load the KV store itself (services stopped): store export | import",
        description="The KV backend itself, read and written directly with the services "
        "stopped: `store export` dumps every repository to a JSON-lines file, `store import` "
        "loads one into an empty store (the rebuild path across storage format versions). "
        "(`quarry import` is the zero-copy import of a lake into a branch.)",
    )
    actions = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    register_export(actions, common)
    register_import(actions, common)


def register_export(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    export = sub.add_parser(
        "export",
        help="write every repository's refs and staging to a JSON-lines file",
        description="Read the KV backend directly (stop the services first) and write every "
        "repository, its branches, tags, commits, merge hints and staged changes "
        "to FILE. Works whatever storage format version the store holds. Ranges "
        "and metaranges stay in the storage namespaces (import rebuilds those "
        "of an earlier format).",
    )
    export.add_argument("file", metavar="FILE")
    export.add_argument("--kv-url", help=KV_HELP)
    export.set_defaults(func=cmd_export)


def register_import(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    imp = sub.add_parser(
        "import",
        help="load an export file into an empty KV store",
        description="Write an export FILE into a KV store without repositories (stop the "
        "services first), then stamp this build's storage format version. "
        "Committed data of an earlier storage format is rewritten in this "
        "build's format in each repository's storage namespace (new range and "
        "metarange ids; commit ids are kept; old files are left for GC).",
    )
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--kv-url", help=KV_HELP)
    imp.set_defaults(func=cmd_import)


COMMANDS = {"store": register_store}
