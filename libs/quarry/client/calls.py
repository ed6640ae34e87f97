"""The plumbing every RPC wrapper of quarry.client.Client runs on: one unary call under the
retry policy (its failure rebuilt as a domain error), and the page walk of listings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from quarry import errors
from quarry.client.retry import Retrier, RetryPolicy

# Loaded so from_rpc_error can rebuild the core's classes (BranchNotFound, CorruptRecord,
# ...) by reason.
from quarry.graveler import errors as gerrors  # noqa: F401
from quarry.runtime.channels import RELAY_HEADER
from quarry.runtime.errors import domain_errors


class IncompleteListing(errors.DataLoss):
    """A listing page came back without some records the server could not read."""

    reason = "INCOMPLETE_LISTING"


class RpcCalls:
    """The calls' shared state (set by Client.__init__) and plumbing."""

    retry: RetryPolicy
    timeout: float | None
    allow_incomplete_listings: bool
    skipped_corrupt_records: int
    _bm: Any  # BranchManagerStub
    _cm: Any  # CommitterStub
    _relayed_by: Callable[[], str] | None  # a service's token source, when it relays

    def _relay_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The relaying service's token on a staging call (quarry.auth.interceptor
        RELAY_HEADER), None when this client relays nothing."""
        if self._relayed_by is None:
            return None
        return ((RELAY_HEADER, self._relayed_by()),)

    # ---- plumbing ----

    def _unary(
        self,
        stub_method: Callable[..., Any],
        name: str,
        request: Any,
        before_retry: Callable[[errors.QuarryError, Any], None] | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Any:
        def attempt(_number: int) -> Any:
            with domain_errors():
                if metadata is None:
                    return stub_method(request, timeout=self.timeout)
                return stub_method(request, timeout=self.timeout, metadata=metadata)

        hook: Callable[[errors.QuarryError], bool] | None = None
        if before_retry is not None:
            adjust = before_retry

            def hook(exc: errors.QuarryError) -> bool:
                adjust(exc, request)
                return True

        return Retrier(self.retry, name).run(attempt, hook)

    def _pages(self, call: Callable[..., Any], page_token: str = "", **kwargs: Any) -> Iterator:
        token = page_token
        while True:
            page = call(page_token=token, **kwargs)
            # The server left corrupt records out of this page (CORRUPT_RECORD): refuse, or
            # tally them so a caller (the CLI) can warn; `quarry doctor` names them.
            skipped = getattr(page, "skipped_corrupt_records", 0)
            if skipped:
                self.skipped_corrupt_records += skipped
                if not self.allow_incomplete_listings:
                    raise IncompleteListing(
                        f"the server left {skipped} corrupt record(s) out of this listing; "
                        f"refusing to go on with an incomplete listing (run `quarry doctor` "
                        f"to find them)",
                        metadata={"skipped_corrupt_records": str(skipped)},
                    )
            yield page
            token = page.next_page_token
            if not token:
                return
