"""A bare gRPC echo server: the floor one RPC costs on this machine (no interceptors, no
protobuf work, same thread pool size as a Quarry service). With `--forward PORT` each call
first makes one echo call to another echo server: the floor of a request that needs one
downstream hop (as StatObject needs its branch read from the kv-gateway).
Prints its port, then serves until stdin closes."""

import sys
from concurrent import futures

import grpc


def main() -> None:
    forward = None
    if len(sys.argv) == 3 and sys.argv[1] == "--forward":
        channel = grpc.insecure_channel(f"127.0.0.1:{sys.argv[2]}")
        forward = channel.unary_unary("/bench.Echo/Echo")

    def echo(request, context):
        return forward(request) if forward is not None else request

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
