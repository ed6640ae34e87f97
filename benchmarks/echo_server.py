"""A bare gRPC echo server: the floor one RPC costs on this machine (no interceptors, no
protobuf work, same thread pool size as a Quarry service). Prints its port, then serves
until stdin closes."""

import sys
from concurrent import futures

import grpc


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request),
    })
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
