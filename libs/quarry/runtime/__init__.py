"""The common service runtime: servers, error mapping, format version."""
