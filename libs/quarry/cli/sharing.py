"""`quarry cp` (an object's entry at another path, its bytes shared) and `quarry presign`
(a time-limited S3 URL of an object, signed with the CLI's own credentials): lakectl's
`fs cp` and `fs presign`."""

from __future__ import annotations

import argparse
from typing import Any

from quarry.cli import output
from quarry.cli.base import CliError, Context, Subparsers, UsageError, command, leaf

# SigV4's own bound on a presigned URL's lifetime (7 days).
MAX_PRESIGN_SECONDS = 7 * 24 * 3600


@command
def cp(args: argparse.Namespace, ctx: Context) -> int:
    """Stage DEST with SOURCE's entry at SRC_REF: the same bytes (no copy: entries point at
    immutable objects), content type and metadata. Within one repository, as lakeFS's copy
    API (BranchManager/CopyObject: fs:ReadObject on the source, fs:WriteObject on DEST)."""
    staged = ctx.client.copy_object(
        args.repo,
        args.src_ref,
        args.src_path,
        args.dest_branch,
        args.dest_path,
        if_absent=not args.force,
    )
    if ctx.json:
        output.print_json(staged)
    else:
        print(
            f"Staged {staged.path} on {args.repo}/{args.dest_branch} "
            f"(the object of {args.src_path} at {args.src_ref})"
        )
    return 0


@command
def presign(args: argparse.Namespace, ctx: Context) -> int:
    """A GET URL of REF/PATH through the S3 gateway, signed (SigV4, query string) with the
    CLI's own credentials, good for --expires seconds: whoever holds it reads that object
    as the credentials' user, until it expires. Nothing is sent anywhere to make it; the
    object is looked up first, so a missing object or a denied read fails here."""
    from botocore.config import Config

    from quarry.client import load_credentials

    if not 0 < args.expires <= MAX_PRESIGN_SECONDS:
        raise UsageError(f"--expires is 1..{MAX_PRESIGN_SECONDS} seconds (SigV4's bound)")
    credentials = load_credentials()
    if credentials is None:
        raise CliError(
            "NO_CREDENTIALS",
            "presign signs with the CLI's credentials: set QUARRY_ACCESS_KEY_ID and "
            "QUARRY_SECRET_ACCESS_KEY, or run `quarry setup`",
            "UNAUTHENTICATED",
        )
    ctx.client.stat_object(args.repo, args.ref, args.path)
    settings = ctx.settings
    endpoint = args.endpoint_url or s3_gateway_url(settings)
    import boto3

    s3 = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        region_name=settings.s3_gateway_region,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    url = s3.generate_presigned_url(
        "get_object",
        Params={"Bucket": args.repo, "Key": f"{args.ref}/{args.path}"},
        ExpiresIn=args.expires,
    )
    if ctx.json:
        output.print_json({"url": url, "expires_in": args.expires})
    else:
        print(url)
    return 0


def s3_gateway_url(settings: Any) -> str:
    """The S3 gateway's URL as this CLI's settings name it: https when the suite serves TLS
    (a server's certificate, or a client set up with the suite's CA as docs/tls.md shows)."""
    tls = settings.tls_cert_file or settings.tls_ca_file
    return f"{'https' if tls else 'http'}://{settings.s3_gateway_address}"


def register_cp(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "cp", cp, "stage an object's entry at another path (no bytes copied)")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("src_ref", metavar="SOURCE_REF", help="the ref to copy from")
    p.add_argument("src_path", metavar="SOURCE_PATH", help="the object to copy")
    p.add_argument("dest_branch", metavar="DEST_BRANCH", help="the branch to stage it on")
    p.add_argument("dest_path", metavar="DEST_PATH", help="its path there")
    p.add_argument("--force", "-f", action="store_true", help="replace DEST_PATH's entry")


def register_presign(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "presign", presign, "print a time-limited S3 URL of an object")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--expires",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="how long the URL works (default 3600; at most 7 days)",
    )
    p.add_argument(
        "--endpoint-url",
        default="",
        metavar="URL",
        help="the S3 gateway as the URL's holder reaches it (default: this CLI's "
        "QUARRY_S3_GATEWAY_ADDRESS, https under TLS)",
    )


COMMANDS = {"cp": register_cp, "presign": register_presign}
