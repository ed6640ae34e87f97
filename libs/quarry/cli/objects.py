"""`quarry put` (stage an entry, or upload local files and stage them), `rm`, `ls`, `stat`,
`cat` and `get` (an object's bytes, streamed and checked against its entry)."""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from quarry import errors
from quarry.cli import output, style
from quarry.cli.base import (
    CliError,
    Context,
    Subparsers,
    UsageError,
    command,
    key_value,
    leaf,
    progress_option,
)
from quarry.cli.progress import human_bytes
from quarry.v1 import types_pb2


@command
def put(args: argparse.Namespace, ctx: Context) -> int:
    metadata = dict(args.meta or [])
    if args.source is not None:
        return _put_from(args, ctx, metadata)
    if not args.address:
        raise UsageError(
            "put needs --address ADDR (an object already in "
            "storage) or --from LOCAL_FILE_OR_DIR (upload)"
        )
    entry = ctx.client.put_object(
        args.repo,
        args.branch,
        path=args.path,
        physical_address=args.address,
        size_bytes=args.size,
        checksum=args.checksum,
        content_type=args.content_type,
        metadata=metadata,
        mtime=_dt.datetime.now(_dt.UTC),
        if_absent=args.if_absent,
    )
    if ctx.json:
        output.print_json(entry)
    else:
        print(f"Staged {entry.path} on {args.repo}/{args.branch}")
    return 0


def _put_from(args: argparse.Namespace, ctx: Context, metadata: dict[str, str]) -> int:
    from quarry.blob import open_blob_store
    from quarry.cli import upload

    if args.address:
        raise UsageError("--address and --from exclude each other")
    source = Path(args.source)
    skipped: list[str] = []
    items = upload.plan(source, args.path, skipped)
    if skipped:
        # Said, not silent: a broken link in a dataset is usually missing data.
        shown = ", ".join(skipped[:10]) + (
            f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        )
        print(f"quarry put: skipping {len(skipped)} not regular files: {shown}", file=sys.stderr)
    if not items:
        raise CliError("NOTHING_TO_UPLOAD", f"no files under {source}")
    if args.if_absent and len(items) != 1:
        raise UsageError("--if-absent applies to a single file")
    client = ctx.client
    repo = client.get_repository(args.repo)
    # Fail on a missing branch before any bytes move.
    client.branch_to_write(args.repo, args.branch)
    store = open_blob_store(repo.storage_namespace, ctx.settings)
    entries = []
    try:
        if len(items) == 1:
            entries = list(
                upload.upload_all(store, repo.storage_namespace, items, args.content_type, metadata)
            )
            staged = client.put_object(args.repo, args.branch, entries[0], if_absent=args.if_absent)
            entries, count = [staged], 1
        else:
            with ctx.progress("uploading", total=len(items), unit="files") as bar:
                entries = list(
                    upload.upload_all(
                        store,
                        repo.storage_namespace,
                        items,
                        args.content_type,
                        metadata,
                        on_done=lambda _e: bar.advance(),
                    )
                )
            with ctx.progress("staging", total=len(entries), unit="entries") as bar:
                count = client.put_objects(args.repo, args.branch, entries, progress=bar.update)
    except errors.QuarryError as refused:
        named: set[str] = set()
        if len(entries) > 1 and refused.code.name in upload.REFUSALS:
            # A stream may be refused after batches of it were staged: keep what the branch
            # names (nothing removed when it cannot be read).
            try:
                named = {
                    e.physical_address
                    for e in client.iter_objects(args.repo, args.branch, prefix=args.path)
                }
            except errors.QuarryError:
                raise refused from None
        upload.remove_refused(store, repo.storage_namespace, entries, refused.code.name, named)
        raise
    finally:
        store.close()
    total_bytes = sum(e.size_bytes for e in entries)
    if ctx.json:
        output.print_json(
            {
                "staged": count,
                "bytes": total_bytes,
                "entries": [output.to_jsonable(e) for e in entries],
            }
        )
    else:
        files = "file" if len(entries) == 1 else "files"
        where = (
            entries[0].path
            if len(entries) == 1
            else (args.path.strip("/") + "/" if args.path.strip("/") else "/")
        )
        print(
            f"Uploaded {len(entries)} {files} ({human_bytes(total_bytes)}) to "
            f"{args.repo}/{args.branch}: {where}"
        )
    return 0


def register_put(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(
        common,
        sub,
        "put",
        put,
        "stage an object already in storage (--address), or upload "
        "local files into the repository's storage (--from)",
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument(
        "path",
        help="object path; with --from, the destination (a directory's files go under PATH/)",
        metavar="PATH",
    )
    p.add_argument("--address", metavar="ADDR", help="physical address of the object")
    p.add_argument(
        "--from", dest="source", metavar="LOCAL_FILE_OR_DIR", help="upload this file or directory"
    )
    p.add_argument(
        "--size",
        type=int,
        default=0,
        metavar="N",
        help="size in bytes (cat/get check it; 0 with no --checksum: unknown, not checked)",
    )
    p.add_argument("--checksum", default="", metavar="C")
    p.add_argument("--content-type", default="", metavar="T")
    p.add_argument(
        "--meta", action="append", type=key_value, metavar="K=V", help="user metadata (repeatable)"
    )
    p.add_argument("--if-absent", action="store_true", help="fail if the path already has an entry")
    progress_option(p)


@command
def rm(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client
    if not args.paths:
        raise UsageError("name the FOLDERs to remove" if args.recursive else "name the paths")
    if args.recursive:
        # Each PATH names a folder, as `quarry ls` shows it: `-r t` is `t/`, never also
        # `tables/` and `tmp/` (safety: rm must not remove what the user did not name; an
        # empty FOLDER, an unset shell variable, would name the whole branch).
        if any(not folder.strip("/") for folder in args.paths):
            raise UsageError("rm -r takes a FOLDER; to drop every change, `quarry discard`")
        paths: list[str] = []
        with ctx.progress("listing", unit="objects") as bar:
            for folder in dict.fromkeys(f if f.endswith("/") else f + "/" for f in args.paths):
                for entry in client.iter_objects(args.repo, args.branch, prefix=folder):
                    paths.append(entry.path)
                    bar.advance()
    else:
        paths = list(args.paths)
    requested = len(set(paths))
    if not paths:
        deleted = 0
    else:
        with ctx.progress("removing", total=len(paths), unit="paths") as bar:
            deleted = client.delete_objects(args.repo, args.branch, paths, progress=bar.update)
    if ctx.json:
        output.print_json({"removed": deleted, "requested": requested})
    else:
        noun = "object" if deleted == 1 else "objects"
        missing = requested - deleted
        extra = f" ({missing} did not exist)" if missing else ""
        print(f"Removed {deleted} {noun} from {args.repo}/{args.branch}{extra}")
    return 0


def register_rm(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "rm", rm, "stage the removal of objects")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument(
        "--recursive",
        "-r",
        action="store_true",
        help="each PATH is a FOLDER: remove every object under it (`data` is the folder "
        "`data/`: never `data_raw/`)",
    )
    progress_option(p)


LS_FORMAT = "{mtime:<20}  {size:>12}  {path}"


@command
def ls(args: argparse.Namespace, ctx: Context) -> int:
    delimiter = "" if args.recursive else "/"
    pages = ctx.client.iter_object_pages(
        args.repo, args.ref, prefix=args.prefix, delimiter=delimiter, page_size=args.page_size
    )
    if ctx.json:
        # {"entries": [...], "common_prefixes": [...]}, the entries written as they come.
        prefixes: list[str] = []

        def entries() -> Iterator[types_pb2.Entry]:
            for page in pages:
                prefixes.extend(page.common_prefixes)
                yield from page.entries

        sys.stdout.write('{\n  "entries": ')
        output.print_json_array(entries(), indent="  ")
        sys.stdout.write(',\n  "common_prefixes": ')
        output.print_json_array(prefixes, indent="  ")
        sys.stdout.write("\n}\n")
        return 0
    out = sys.stdout
    # stdout is held until the command succeeds (quarry.cli.base.command): an error on a
    # later page leaves no header or half a listing behind.
    out.write(style.header(LS_FORMAT.format(mtime="MODIFIED", size="SIZE", path="PATH")) + "\n")
    # Only long listings get a counter: it appears from the second page on.
    bar = ctx.progress("listing", unit="entries") if args.recursive else None
    listed = 0
    for page in pages:
        if bar is not None:
            bar.clear()
        items = sorted(
            [(p, None) for p in page.common_prefixes] + [(e.path, e) for e in page.entries],
            key=lambda item: item[0],
        )
        for path, entry in items:
            if entry is None:
                # The last column: no padding.
                folder = style.paint(output.shown(path, one_line=True), "blue", "bold")
                out.write(LS_FORMAT.format(mtime="", size="PRE", path=folder) + "\n")
            else:
                out.write(
                    LS_FORMAT.format(
                        mtime=output.timestamp_text(entry.mtime),
                        size=entry.size_bytes,
                        path=output.shown(path, one_line=True),
                    )
                    + "\n"
                )
        listed += len(items)
        if bar is not None and page.next_page_token:
            out.flush()
            bar.update(listed)
    if bar is not None:
        bar.clear()
    return 0


def register_ls(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "ls", ls, "list objects on a ref")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    p.add_argument(
        "--recursive",
        "-r",
        action="store_true",
        help="every object under the prefix (no '/' grouping)",
    )
    p.add_argument(
        "--page-size",
        type=int,
        default=0,
        metavar="N",
        help="entries per request (default: the server's)",
    )
    progress_option(p)


@command
def stat(args: argparse.Namespace, ctx: Context) -> int:
    entry = ctx.client.stat_object(args.repo, args.ref, args.path)
    if ctx.json:
        output.print_json(entry)
        return 0
    output.fields(
        [
            ("path", entry.path),
            ("physical address", entry.physical_address),
            ("size", f"{entry.size_bytes} ({human_bytes(entry.size_bytes)})"),
            ("checksum", entry.checksum or "-"),
            ("modified", output.timestamp_text(entry.mtime)),
            ("content type", entry.content_type or "-"),
            ("metadata", output.metadata_text(entry.metadata)),
        ]
    )
    return 0


def register_stat(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "stat", stat, "show an object's entry")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("path", metavar="PATH")


def _copy_object(
    args: argparse.Namespace,
    ctx: Context,
    write: Callable[[bytes], object],
    entry: types_pb2.Entry | None = None,
) -> int:
    """Stream the bytes of PATH at REF (or of `entry`) through `write`, read from where its
    entry points (the repository's storage namespace, local or S3, or an imported object's
    own address), checked against the entry (quarry.blob.copy_object: DATA_LOSS /
    OBJECT_CHANGED when the size differs, CHECKSUM_MISMATCH when a SHA-256 checksum
    differs). The byte count."""
    from quarry.blob import copy_object

    if entry is None:
        entry = ctx.client.stat_object(args.repo, args.ref, args.path)
    return copy_object(
        entry.physical_address,
        write,
        ctx.settings,
        size_bytes=entry.size_bytes,
        checksum=entry.checksum,
    )


@command
def cat(args: argparse.Namespace, ctx: Context) -> int:
    """Stream the object to stdout as it is read: its bytes are never held in memory, nor
    behind the CLI's usual hold of stdout until success. A failure while reading, or at the
    end a size or checksum that is not the entry's, exits 1 with the error on stderr; the
    bytes already written stay written (as with curl or `aws s3 cp - `)."""
    return _to_stdout(args, ctx)


def _to_stdout(args: argparse.Namespace, ctx: Context) -> int:
    out = ctx.unheld_stdout()
    _copy_object(args, ctx, out.write)
    out.flush()  # a closed pipe (`| head -c 10`) shows here, still a success (main)
    return 0


@command
def get(args: argparse.Namespace, ctx: Context) -> int:
    """Write the object to FILE, or with -r every object under FOLDER into DIR (their paths
    below FOLDER kept). Each file as _write_file writes it."""
    if args.recursive:
        return _get_folder(args, ctx)
    if args.output == "-":  # as curl and aws s3 cp: `-o -` is stdout
        return _to_stdout(args, ctx)
    name = args.path.rsplit("/", 1)[-1]  # as given: pathlib would drop a trailing "." or "/"
    if name in ("", ".", "..") and (not args.output or Path(args.output).is_dir()):
        # A path ending in "/", "." or "..": no file name to derive.
        raise UsageError(f"{args.path!r} names no file: give one with -o FILE")
    target = Path(args.output or name)
    if target.is_dir():
        target = target / name
    target, size = _write_file(args, ctx, target, None)
    if ctx.json:
        output.print_json({"path": args.path, "file": str(target), "bytes": size})
    else:
        print(f"Wrote {args.repo}/{args.ref}: {args.path} to {target} ({human_bytes(size)})")
    return 0


def _write_file(
    args: argparse.Namespace, ctx: Context, target: Path, entry: types_pb2.Entry | None
) -> tuple[Path, int]:
    """Write one object (PATH, or `entry`) to `target`: (the file written, its bytes).

    Safety: never overwrites an existing file without --force, never leaves a partial
    file, and never leaves a file whose bytes differ from the entry: the bytes stream into
    a temporary file beside it, which takes its name only once complete and checked
    against the entry (size, and SHA-256 where the entry records one); on any failure it
    is removed. A link is followed (--force replaces the file it points to, never the
    link); a pipe or a device is refused, never replaced."""
    from quarry.cli.files import write_whole_file

    return write_whole_file(
        target,
        lambda fh: _copy_object(args, ctx, fh.write, entry),
        force=args.force,
        hint=f"stream into it with `quarry cat ... > {target}`",
    )


def _get_folder(args: argparse.Namespace, ctx: Context) -> int:
    """Every object under FOLDER (a folder, as `rm -r` takes it: `t` is `t/`) into DIR (-o,
    default: the current directory), at its path below FOLDER.

    Safety: nothing is written outside DIR: an object whose path below FOLDER has an
    empty, `.` or `..` segment (paths are the writers' strings, not file names) is
    skipped and named, never resolved. Each file is written as _write_file writes one;
    the first failure stops the download (what was written stays, each file complete and
    checked)."""
    import os

    folder = args.path
    if folder and not folder.endswith("/"):
        folder += "/"
    root = Path(args.output or ".")
    if args.output == "-":
        raise UsageError("get -r writes files: give a directory with -o DIR")
    root.mkdir(parents=True, exist_ok=True)
    real_root = os.path.realpath(root)
    written, total, skipped = 0, 0, []
    with ctx.progress("downloading", unit="objects") as bar:
        for entry in ctx.client.iter_objects(args.repo, args.ref, prefix=folder):
            relative = entry.path[len(folder) :]
            parts = relative.split("/")
            if any(part in ("", ".", "..") for part in parts):
                skipped.append(f"{entry.path!r} (no file name)")
                continue
            target = root.joinpath(*parts)
            # Safety: a link inside DIR (to a directory or a file outside it) must not carry
            # a write out of DIR: the resolved target stays below the resolved DIR.
            real = os.path.realpath(target)
            if os.path.commonpath([real_root, real]) != real_root:
                skipped.append(f"{entry.path!r} (a link leads out of {root})")
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                skipped.append(f"{entry.path!r} (a file is where its folder would be)")
                continue
            if target.is_dir():
                skipped.append(f"{entry.path!r} (a folder is where the file would be)")
                continue
            _, size = _write_file(args, ctx, target, entry)
            written, total = written + 1, total + size
            bar.advance()
    if skipped:
        shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more" if skipped[10:] else "")
        print(f"quarry get: skipped {len(skipped)} objects: {shown}", file=sys.stderr)
    if not written and not skipped:
        raise CliError(
            "NOTHING_TO_DOWNLOAD",
            f"no object under {folder or '/'} at {args.repo}/{args.ref}",
            "NOT_FOUND",
        )
    if ctx.json:
        output.print_json(
            {"folder": folder, "directory": str(root), "files": written, "bytes": total}
        )
    else:
        print(
            f"Wrote {written} {'file' if written == 1 else 'files'} ({human_bytes(total)}) "
            f"from {args.repo}/{args.ref}: {folder or '/'} to {root}"
        )
    return 0


# Shown by `quarry cat --help` and `quarry get --help`.
INTEGRITY_HELP = (
    "The bytes are streamed (never held in memory) and checked against the entry: a size "
    "other than the entry's fails with DATA_LOSS / OBJECT_CHANGED, and where the entry's "
    "checksum is a SHA-256 (what `quarry put --from` and Spark writes record) a different "
    "hash fails with DATA_LOSS / CHECKSUM_MISMATCH. Other checksum forms (an S3 ETag of an "
    "imported object) are checked by size only."
)


def register_cat(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "cat", cat, "write an object's bytes to stdout")
    p.epilog = (
        f"{INTEGRITY_HELP} The bytes go to stdout as they are read: on a failure midway, or "
        "a failed check at the end, what was written stays written and the command exits 1 "
        "with the error on stderr. A closed pipe (`| head -c 10`) is a success."
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("path", metavar="PATH")


def register_get(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "get", get, "download an object's bytes into a local file")
    p.epilog = (
        f"{INTEGRITY_HELP} FILE appears only once its bytes are complete and checked; on any "
        "failure no FILE is left (and an existing one is only replaced with --force)."
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the file (or directory) to write (default: PATH's name in this directory; "
        "- for stdout); a link is followed, a pipe or device refused",
    )
    p.add_argument("--force", "-f", action="store_true", help="overwrite FILE if it exists")
    p.add_argument(
        "--recursive",
        "-r",
        action="store_true",
        help="PATH is a folder: write every object under it into -o DIR (default: here), "
        "keeping their paths below it (lakectl fs download -r)",
    )


COMMANDS = {
    "put": register_put,
    "rm": register_rm,
    "ls": register_ls,
    "stat": register_stat,
    "cat": register_cat,
    "get": register_get,
}
