"""`quarry doctor`: a read-only check of the KV data through the kv-gateway."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.base import EXIT_FAILURE, Context, Subparsers, command, leaf


@command
def doctor(args: argparse.Namespace, ctx: Context) -> int:
    """Read-only: corrupt records and dangling references (see quarry.doctor)."""
    from quarry import doctor as checkup
    from quarry.blob import open_blob_store
    from quarry.kv.remote import RemoteStore

    # Through the client's channel factory: the kv-gateway needs the caller's token (kv:Read).
    address = args.kv_gateway or ctx.settings.kv_gateway_address
    store = RemoteStore(ctx.client.authenticated_channel(address), timeout=args.timeout)
    try:
        report = checkup.Doctor(
            store,
            lambda ns: open_blob_store(ns, ctx.settings),
            lambda: checkup.gateway_staging_partitions(store),
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


def register_doctor(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(
        common,
        sub,
        "doctor",
        doctor,
        "read-only check: corrupt records and dangling references (exit 1 if any)",
    )
    p.add_argument(
        "repo",
        metavar="REPO",
        nargs="?",
        help="check only this repository (default: everything, with the cleanup "
        "queue and orphan staging tokens)",
    )
    p.add_argument(
        "--kv-gateway",
        metavar="HOST:PORT",
        help="kv-gateway address (default: QUARRY_KV_GATEWAY_ADDRESS)",
    )


COMMANDS = {"doctor": register_doctor}
