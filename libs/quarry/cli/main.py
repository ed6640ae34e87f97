"""The `quarry` command line.

    quarry up                 start every service on the embedded defaults
    quarry serve SERVICE      run one service (kv-gateway, ...)
    quarry version            package and storage format versions
    quarry settings           every setting with its default
    quarry export FILE        dump every repository's refs and staging to a file
    quarry import FILE        load such a file into an empty KV store

and the client commands of quarry.cli.commands (repo, branch, tag, put, rm, ls, stat,
commit, log, diff, reset, discard, compact, stats).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import quarry
from quarry import errors
from quarry.config import SERVICES, load_settings, settings_markdown, settings_text

# The services built so far. Each maps to the module whose `build(settings) -> ServiceSpec`
# wires it and whose DEPENDS_ON names the services it needs in order to serve.
SERVICE_MODULES = {
    "kv-gateway": "kv_gateway.service",
    "range-writer": "range_writer.service",
    "branch-manager": "branch_manager.service",
    "committer": "committer.service",
    "compactor-sensor": "compactor_sensor.service",
}


def _service_builder(name: str):
    if name not in SERVICES:
        raise SystemExit(f"quarry: unknown service {name!r}; services: {', '.join(SERVICES)}")
    if name not in SERVICE_MODULES:
        raise SystemExit(f"quarry: service {name!r} is not built yet; available: "
                         f"{', '.join(SERVICE_MODULES)}")
    return importlib.import_module(SERVICE_MODULES[name]).build


def start_order() -> list[str]:
    """The services with each after the ones it depends on (SERVICE_MODULES order among
    equals). Any order works — a service waits for its dependencies, NOT_SERVING — but this
    one makes `quarry up` ready soonest, and its reverse stops dependents first, so no
    service is left running without what it needs."""
    depends_on = {name: tuple(importlib.import_module(module).DEPENDS_ON)
                  for name, module in SERVICE_MODULES.items()}
    order: list[str] = []
    while len(order) < len(depends_on):
        ready = [name for name in depends_on if name not in order
                 and all(d in order for d in depends_on[name] if d in depends_on)]
        if not ready:
            raise RuntimeError(f"dependency cycle among {sorted(set(depends_on) - set(order))}")
        order.append(ready[0])
    return order


def cmd_serve(args: argparse.Namespace) -> int:
    from quarry.runtime.server import serve

    settings = load_settings()
    build = _service_builder(args.service)
    try:
        serve(settings, build)
    except errors.QuarryError as exc:
        print(f"quarry serve {args.service}: {exc}", file=sys.stderr)
        return 2
    return 0


def _command(name: str) -> str:
    """How to type a tool installed next to this Python: its bare name when that is what
    the PATH finds, else its path (e.g. .venv/bin/quarry after `make run`)."""
    installed = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and Path(found).resolve() == installed.resolve():
        return name
    try:
        return os.path.relpath(installed)
    except ValueError:
        return str(installed)


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _forward(stream) -> None:
    """Keep a child's stdout drained (a full pipe would block it) and visible."""
    for line in stream:
        sys.stdout.write(line)


def cmd_up(args: argparse.Namespace) -> int:
    settings = load_settings()
    home = Path(settings.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, QUARRY_HOME=str(home), PYTHONUNBUFFERED="1")
    print(f"Quarry {quarry.__version__} (storage format {quarry.FORMAT_VERSION})")
    print(f"  data:   {home}  (KV: {settings.effective_kv_url})")
    children: list[tuple[str, subprocess.Popen]] = []
    # Explicit handlers: a shell that starts us in the background sets SIGINT to "ignore",
    # which Python would otherwise keep.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    # The services have their own process group (below), so a closed terminal's SIGHUP
    # reaches only us: stop them in order then too.
    signal.signal(signal.SIGHUP, _interrupt)

    def stop_all() -> None:
        # Dependents first, one at a time: each drains while what it calls is still up. A
        # service that outlives its grace period (plus slack) is killed.
        for name, child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=settings.shutdown_grace_seconds + 5)
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in time; killing it", file=sys.stderr)
                child.kill()
                child.wait()
            print(f"  {name} stopped (exit {child.returncode})", flush=True)

    try:
        for name in start_order():
            # Its own process group: Ctrl-C in the terminal reaches only `quarry up`, which
            # then stops the services in order (else all would stop at once, the kv-gateway
            # possibly first).
            child = subprocess.Popen([sys.executable, "-m", "quarry.cli.main", "serve", name],
                                     env=env, stdout=subprocess.PIPE, text=True,
                                     process_group=0)
            children.append((name, child))
            line = child.stdout.readline()
            if "ready" not in line:
                child.wait(timeout=10)
                print(f"quarry up: {name} failed to start (exit {child.returncode})",
                      file=sys.stderr)
                stop_all()
                return 1
            threading.Thread(target=_forward, args=(child.stdout,), daemon=True).start()
            port = settings.port_of(name)
            metrics = settings.metrics_port_of(name)
            print(f"  {name:<17} {settings.listen_host}:{port}"
                  + (f"   metrics http://{settings.metrics_host}:{metrics}/metrics"
                     if metrics else ""))
        host = settings.listen_host
        lake = home / "lake" / "demo"
        q, grpcurl = _command("quarry"), _command("grpcurl")
        print("\nTry it from another terminal:")
        print(f"  {q} repo create demo {lake}")
        print(f"  {q} put demo main docs/ --from README.md")
        print(f"  {q} commit demo main -m 'first commit'")
        print(f"  {q} ls demo main --recursive && {q} log demo main")
        print("\nOr with grpcurl (every service serves reflection):")
        print(f"  {grpcurl} -plaintext {host}:{settings.branch_manager_port} list")
        print(f"  {grpcurl} -plaintext -d '{{\"repository\":\"demo\",\"ref\":\"main\"}}' "
              f"{host}:{settings.branch_manager_port} quarry.v1.BranchManager/ListObjects")
        print(f"  {grpcurl} -plaintext {host}:{settings.kv_gateway_port} "
              "quarry.v1.ServerInfo/GetServerInfo")
        print("\nOr from PySpark (README: Spark), and garbage-collect with Spark:")
        print("  import quarry.spark as qs; "
              "qs.write(df, 'quarry://demo/main/tables/t', mode='append')")
        print(f"  {q} gc run demo            # a dry run; --sweep deletes")
        print("\nPress Ctrl-C to stop.", flush=True)
        while True:
            for name, child in children:
                if child.poll() is not None:
                    print(f"quarry up: {name} exited with {child.returncode}", file=sys.stderr)
                    stop_all()
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        stop_all()
        print("stopped.")
        return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"quarry {quarry.__version__}")
    print(f"storage format version {quarry.FORMAT_VERSION}")
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    print(settings_markdown() if args.markdown else settings_text(), end="")
    return 0


def _open_kv(url: str | None, must_exist: bool):
    """The KV backend itself (not the gateway): the services should be stopped."""
    import urllib.parse

    from quarry.kv import open_store

    url = url or load_settings().effective_kv_url
    parsed = urllib.parse.urlsplit(url)
    if must_exist and parsed.scheme.lower() == "sqlite":
        path = urllib.parse.unquote(parsed.netloc + parsed.path)
        if path and not os.path.exists(path):
            raise errors.NotFound(f"no KV store at {path}")
    return open_store(url)


def _progress(verb: str):
    def report(count: int) -> None:
        print(f"  {verb} {count} items...", file=sys.stderr, flush=True)
    return report


def _transfer(name: str, run) -> int:
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
        try:
            with open(partial, "w", encoding="utf-8") as out:
                summary = exporting.export_store(store, out, _progress("exported"))
            os.replace(partial, target)
        finally:
            store.close()
            partial.unlink(missing_ok=True)
        print(f"exported {summary.repositories} repositories, {summary.items} items "
              f"(storage format {summary.format_version or 'unstamped'}) to {target}",
              file=sys.stderr)
        return 0

    return _transfer("export", run)


def cmd_import(args: argparse.Namespace) -> int:
    from quarry import exporting
    from quarry.blob import open_blob_store

    def run() -> int:
        settings = load_settings()
        with open(args.file, encoding="utf-8") as lines:
            store = _open_kv(args.kv_url, must_exist=False)
            try:
                summary = exporting.import_store(
                    store, lines, _progress("imported"),
                    open_namespace=lambda namespace: open_blob_store(namespace, settings))
            finally:
                store.close()
        print(f"imported {summary.repositories} repositories, {summary.items} items "
              f"(exported from storage format {summary.format_version or 'unstamped'}; "
              f"stamped {quarry.FORMAT_VERSION})", file=sys.stderr)
        if summary.metaranges_rewritten:
            print(f"rebuilt committed data in storage format {quarry.FORMAT_VERSION}: "
                  f"{summary.ranges_rewritten} ranges, {summary.metaranges_rewritten} "
                  f"metaranges rewritten; {summary.merge_hints_dropped} merge hints dropped",
                  file=sys.stderr)
        return 0

    return _transfer("import", run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quarry", description=__doc__.split("\n")[0]
                                     or "Quarry: version control for data-lake metadata")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start every service on the embedded defaults")
    up.set_defaults(func=cmd_up)
    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("service", choices=SERVICES)
    serve.set_defaults(func=cmd_serve)
    version = sub.add_parser("version", help="print the package and storage format versions")
    version.set_defaults(func=cmd_version)
    settings = sub.add_parser("settings", help="list every setting with its default")
    settings.add_argument("--markdown", action="store_true", help="as a Markdown table")
    settings.set_defaults(func=cmd_settings)
    kv_help = "KV store URL (default: the settings' KV URL, QUARRY_KV_URL / QUARRY_HOME)"
    export = sub.add_parser(
        "export", help="write every repository's refs and staging to a JSON-lines file",
        description="Read the KV backend directly (stop the services first) and write every "
                    "repository, its branches, tags, commits, merge hints and staged changes "
                    "to FILE. Works whatever storage format version the store holds. Ranges "
                    "and metaranges stay in the storage namespaces (import rebuilds those "
                    "of an earlier format).")
    export.add_argument("file", metavar="FILE")
    export.add_argument("--kv-url", help=kv_help)
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser(
        "import", help="load an export file into an empty KV store",
        description="Write an export FILE into a KV store without repositories (stop the "
                    "services first), then stamp this build's storage format version. "
                    "Committed data of an earlier storage format is rewritten in this "
                    "build's format in each repository's storage namespace (new range and "
                    "metarange ids; commit ids are kept; old files are left for GC).")
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--kv-url", help=kv_help)
    imp.set_defaults(func=cmd_import)
    from quarry.cli import commands

    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `quarry settings | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
