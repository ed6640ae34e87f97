"""The README's settings table is the generated one: every setting, its default, its meaning."""

import io
from contextlib import redirect_stdout
from pathlib import Path

from quarry.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_table_is_current():
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        main(["settings", "--markdown"])
    text = README.read_text()
    begin = text.index("<!-- settings:begin")
    block = text[text.index("\n", begin) + 1 : text.index("<!-- settings:end -->")]
    assert block == buffer.getvalue(), (
        "README settings table is stale: regenerate it with `quarry settings --markdown`"
    )


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = text[text.index("```sh") : text.index("```", text.index("```sh") + 5)]
    assert "make run" in first_block and "make test" in first_block
