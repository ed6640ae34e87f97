"""What HTTP allows in a header (RFC 9110), for the places that turn user-written text into
headers: the S3 gateway's stored metadata and action hooks' `headers`."""

from __future__ import annotations

import re

# A header name: an RFC 9110 token.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def is_header_name(text: str) -> bool:
    return _TOKEN.fullmatch(text) is not None


def is_header_value(text: str) -> bool:
    """No control character but tab (a CR/LF would split the message)."""
    return all(c == "\t" or (c >= " " and c != "\x7f") for c in text)
