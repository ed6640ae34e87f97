"""Every ErrorInfo reason belongs to exactly one exception class, so a client rebuilding
an error from its reason (quarry.runtime.errors.from_rpc_error) gets a definite class."""

import importlib
import pkgutil

import quarry
from quarry import errors


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_reasons_are_unique_and_upper_snake_case():
    for module in pkgutil.walk_packages(quarry.__path__, "quarry."):
        if module.name.startswith(("quarry.spark", "quarry.v1")):
            continue
        importlib.import_module(module.name)
    owners: dict[str, type] = {}
    for cls in _all_subclasses(errors.QuarryError):
        if cls.__module__.startswith("tests") or "test" in cls.__module__:
            continue
        assert cls.reason.isupper() and " " not in cls.reason, cls
        other = owners.setdefault(cls.reason, cls)
        assert other is cls, (
            f"{cls.reason}: {other.__module__}.{other.__name__} and {cls.__module__}.{cls.__name__}"
        )


def test_a_status_quoting_a_huge_input_stays_within_the_trailer_limit():
    """Found by tests/integration/test_properties.py: a 70 KB name quoted in the message and
    ErrorInfo pushed the trailers past gRPC's 16 KB limit, and the client got
    RESOURCE_EXHAUSTED without any reason."""
    from google.rpc import error_details_pb2

    from quarry import errors
    from quarry.runtime.errors import to_status

    huge = "h" * 70_000
    status = to_status(
        errors.InvalidArgument(f"invalid name {huge!r}", metadata={"name": huge, "short": "kept"})
    )
    assert status.ByteSize() < 8_000
    assert status.message.startswith("invalid name 'hhh") and "70015 characters" in status.message
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "INVALID_ARGUMENT" and info.metadata["short"] == "kept"
    assert len(info.metadata["name"]) < 600


def test_typed_details_past_the_trailer_budget_are_dropped_and_counted():
    """Any error's typed details (a merge's conflicts, ...) stay within the trailer budget:
    past it they are dropped, ErrorInfo says how many, the reason always arrives."""
    from google.rpc import error_details_pb2

    from quarry import errors
    from quarry.runtime.errors import MAX_STATUS_DETAIL_BYTES, to_status
    from quarry.v1 import types_pb2

    small = types_pb2.MergeConflicts(base_commit_id="b")
    large = types_pb2.MergeConflicts(
        conflicts=[types_pb2.Conflict(path="p" * 500) for _ in range(20)]
    )
    status = to_status(errors.FailedPrecondition("x", details=[small, large]))
    assert status.ByteSize() < MAX_STATUS_DETAIL_BYTES + 100
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.metadata["details_dropped"] == "1" and len(status.details) == 2
    assert status.details[1].Is(types_pb2.MergeConflicts.DESCRIPTOR)
    kept = to_status(errors.FailedPrecondition("x", details=[small]))
    assert len(kept.details) == 2 and "details_dropped" not in str(kept.details[0])
