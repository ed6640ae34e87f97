"""Stored records (generated from protos/quarry/storage/v1): KV values, not API messages."""
