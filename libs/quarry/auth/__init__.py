"""Identity and access (docs/architecture.md §9): the IAM store in the KV `auth` partition,
credentials, lakeFS-compatible policies, bearer tokens, the authorizer, the declaration
table of every RPC and the gRPC interceptor that enforces it.

Domain modules import no gRPC server machinery except `interceptor`, which is the only
place that reads request metadata.
"""
