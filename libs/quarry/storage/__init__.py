"""Internal storage messages (not the gRPC contract): see quarry.graveler.layout."""
