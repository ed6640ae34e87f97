"""The Python client of Quarry's BranchManager and Committer services.

    from quarry.client import Client, Credentials, RetryPolicy

See quarry.client.client for the API (RPC wrappers), quarry.client.entries for how entries,
timestamps and request ids are coerced, quarry.client.streams for the replayable PutObjects
stream and quarry.client.retry for the retry policy, quarry.client.credentials and quarry.client.session for
credentials and the bearer token every call carries.
"""

from quarry.client.client import (
    Cancelled,
    Client,
    DeadlineExceeded,
    IncompleteListing,
    rebuild_error,
)
from quarry.client.credentials import Credentials, load_credentials, write_credentials
from quarry.client.entries import Entry, as_entry, make_entry, new_request_id, to_timestamp
from quarry.client.retry import RETRY_EVENT, RetryPolicy

__all__ = [
    "Client",
    "RetryPolicy",
    "RETRY_EVENT",
    "DeadlineExceeded",
    "Cancelled",
    "Entry",
    "make_entry",
    "as_entry",
    "rebuild_error",
    "to_timestamp",
    "IncompleteListing",
    "new_request_id",
    "Credentials",
    "load_credentials",
    "write_credentials",
]
