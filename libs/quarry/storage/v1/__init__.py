"""Generated code of the internal storage records (protos/quarry/storage/v1, make proto)."""
