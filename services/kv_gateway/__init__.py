"""kv-gateway: the only process that talks to the KV backend."""
