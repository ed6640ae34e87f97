"""The versioning domain core: repositories, refs, staging, commits (no gRPC here)."""
