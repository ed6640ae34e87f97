"""The Python client of Quarry's BranchManager and Committer services.

    from quarry.client import Client, RetryPolicy

See quarry.client.client for the API and quarry.client.retry for the retry policy.
"""

from quarry.client.client import (Cancelled, Client, DeadlineExceeded, Entry, IncompleteListing,
                                  as_entry, make_entry, new_request_id, rebuild_error,
                                  to_timestamp)
from quarry.client.retry import RETRY_EVENT, RetryPolicy

__all__ = ["Client", "RetryPolicy", "RETRY_EVENT", "DeadlineExceeded", "Cancelled", "Entry",
           "make_entry", "as_entry", "rebuild_error", "to_timestamp", "IncompleteListing",
           "new_request_id"]
