"""A range file the history points to and that is gone from the namespace is DATA_LOSS
(committed data is lost), never NOT_FOUND, which a client would read as "no such object"
(issue 23, item 8). Over gRPC against the real suite."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from quarry import errors
from quarry.blob.layout import RANGES_PREFIX


def _committed(client, suite, prefix: str) -> tuple[str, str]:
    """A new repository whose main holds one committed entry, `kept`: (name, namespace)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    namespace = suite.namespace(name)
    client.create_repository(name, namespace)
    client.put_object(name, "main", path="kept", physical_address="s3://b/kept", size_bytes=1)
    client.commit(name, "main", "one")
    return name, namespace


def test_a_missing_range_file_reads_as_data_loss(suite):
    with suite.client() as client:
        name, namespace = _committed(client, suite, "lost")
        ranges = list((Path(namespace) / RANGES_PREFIX).glob("*.parquet"))
        assert ranges
        for path in ranges:  # the namespace is damaged: its range files are gone
            path.unlink()
        with pytest.raises(errors.QuarryError) as caught:
            # A fresh branch-manager read (no cached range): the read must say data is lost.
            client.stat_object(name, "main", "kept")
        assert (caught.value.code.name, caught.value.reason) == ("DATA_LOSS", "RANGE_NOT_FOUND")
        with pytest.raises(errors.QuarryError) as caught:
            list(client.iter_objects(name, "main"))
        assert caught.value.code.name == "DATA_LOSS"


def test_a_truncated_range_file_names_the_range_to_restore(suite):
    """RANGE_CORRUPT said only "unreadable range file: ..." with no metadata: an operator
    could not tell which file of the namespace to restore."""
    with suite.client() as client:
        name, namespace = _committed(client, suite, "torn")
        (path,) = (Path(namespace) / RANGES_PREFIX).glob("*.parquet")
        path.write_bytes(path.read_bytes()[:100])
        with pytest.raises(errors.QuarryError) as caught:
            client.stat_object(name, "main", "kept")
        assert (caught.value.code.name, caught.value.reason) == ("DATA_LOSS", "RANGE_CORRUPT")
        assert caught.value.metadata["range_id"] == path.stem
        assert caught.value.metadata["namespace"] == namespace
        assert path.stem in caught.value.message
