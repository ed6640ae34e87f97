"""Internal storage messages, generated from protos/quarry/storage/v1: KV values and object
records, not the gRPC contract (see quarry.graveler.layout)."""
