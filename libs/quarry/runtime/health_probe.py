"""`python -m quarry.runtime.health_probe HOST:PORT [--service NAME]`: exit 0 when the server's
grpc.health.v1 status is SERVING, 1 otherwise (the Helm chart's exec probes).
`... HOST:PORT --http PATH`: exit 0 when GET PATH answers 2xx (the S3 gateway's /_health),
over HTTPS when the pod's settings name a certificate or CA, presenting the certificate
(mTLS: what a kubelet's own httpGet probe cannot do).

Kubernetes' native gRPC probes speak plaintext only; this one dials through
quarry.runtime.channels.open_channel, the one place channels are opened, so it speaks
whatever the services speak (TLS, mTLS) with the pod's own settings. It imports little, so a
probe costs a fraction of a full `quarry` CLI start.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.runtime.channels import open_channel


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The serving status of `service` ("" = the server overall) at `address`, by name;
    UNREACHABLE:<code> when the call fails."""
    channel = open_channel(address, traced=False)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    except grpc.RpcError as error:
        code = error.code().name if hasattr(error, "code") else "UNKNOWN"
        return f"UNREACHABLE:{code}"
    finally:
        channel.close()
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check_http(address: str, path: str, timeout: float = 3.0) -> str:
    """ "HTTP <status>" of GET `path` at `address`, over HTTPS with the process's TLS settings
    (QUARRY_TLS_*: the CA verifies the server, the certificate is presented) when any is set;
    UNREACHABLE:<error> when the request fails."""
    import ssl
    import urllib.error
    import urllib.request

    from quarry.config import load_settings

    settings = load_settings()
    context = None
    if settings.tls_cert_file or settings.tls_ca_file:
        context = ssl.create_default_context(cafile=settings.tls_ca_file or None)
        if settings.tls_cert_file and settings.tls_key_file:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        if settings.tls_server_name.strip():
            # The name the certificate carries, when it does not name the dialled address.
            context.check_hostname = False
    scheme = "https" if context is not None else "http"
    try:
        with urllib.request.urlopen(
            f"{scheme}://{address}{path}", timeout=timeout, context=context
        ) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except OSError as error:
        return f"UNREACHABLE:{error}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quarry.runtime.health_probe")
    parser.add_argument("address", metavar="HOST:PORT")
    parser.add_argument("--service", default="", help="health service name ('' = overall)")
    parser.add_argument("--http", metavar="PATH", help="GET this path instead (an HTTP service)")
    parser.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.http:
        status = check_http(args.address, args.http, args.timeout)
        if status.startswith("HTTP 2"):
            return 0
        print(f"{args.address}{args.http}: {status}", file=sys.stderr)
        return 1
    status = check(args.address, args.service, args.timeout)
    if status == "SERVING":
        return 0
    print(f"{args.address} {args.service or '(overall)'}: {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
