"""`python -m quarry.runtime.health_probe HOST:PORT [--service NAME]`: exit 0 when the server's
grpc.health.v1 status is SERVING, 1 otherwise (the Helm chart's exec probes).

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quarry.runtime.health_probe")
    parser.add_argument("address", metavar="HOST:PORT")
    parser.add_argument("--service", default="", help="health service name ('' = overall)")
    parser.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    status = check(args.address, args.service, args.timeout)
    if status == "SERVING":
        return 0
    print(f"{args.address} {args.service or '(overall)'}: {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
