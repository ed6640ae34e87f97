"""The console's per-row formatting: links' query values quoted exactly as urllib quotes
them, and timestamps shown for any int64 a client may stage."""

from __future__ import annotations

import datetime
import random
from urllib.parse import parse_qsl, quote_plus, urlsplit

from google.protobuf.timestamp_pb2 import Timestamp

from quarry.console.http import quote_value, url
from quarry.console.templates import timestamp


def test_query_values_are_quoted_as_quote_plus_quotes_them():
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(128)] + ["é", "ß", "日", "\U0001f600"]
    samples = ["", "lake/date=2026-00500/part-0000001.parquet", "a b+c&d=e%f#g?h", "~._-"]
    samples += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(500)
    ]
    for value in samples:
        assert quote_value(value) == quote_plus(value, safe=""), repr(value)


def test_a_link_reads_back_as_its_values():
    link = url("/repos/r/object", ref="main", path="a b/c&d=é+f", empty="", none=None)
    assert dict(parse_qsl(urlsplit(link).query)) == {"ref": "main", "path": "a b/c&d=é+f"}


def test_timestamps_show_utc_and_any_int64():
    moment = Timestamp(seconds=1795912918)
    expected = datetime.datetime.fromtimestamp(1795912918, tz=datetime.UTC)
    assert timestamp(moment) == expected.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert timestamp(Timestamp(seconds=-86400)) == "1969-12-31 00:00:00 UTC"
    assert timestamp(Timestamp()) == timestamp(None) == ""
    # Past datetime's year 9999 (a client may stage any mtime): shown, never a failed page.
    assert timestamp(Timestamp(seconds=10**12)).startswith("33658-")
    assert timestamp(Timestamp(seconds=2**63 - 1)) == f"{2**63 - 1} s after 1970-01-01 UTC"


def test_direction_controls_are_shown_escaped_and_markup_stays_markup():
    import markupsafe

    from quarry.console.templates import Templates, without_bidi

    assert without_bidi("photo\u202egpj.exe") == "photo\\u202egpj.exe"
    built = without_bidi(markupsafe.Markup("<b>x\u2066</b>"))
    assert isinstance(built, markupsafe.Markup) and built == "<b>x\\u2066</b>"
    assert without_bidi(5) == 5
    env = Templates()._env
    page = env.from_string("{{ name|shown }}|{{ html|shown }}|{{ prose }}").render(
        name="<a>\u202e", html=markupsafe.Markup("<i>ok</i>"), prose="\u200f"
    )
    assert page == "&lt;a&gt;\\u202e|<i>ok</i>|\u200f"
