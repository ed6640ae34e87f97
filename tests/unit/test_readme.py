"""The README's settings table is the generated one: every setting, its default, its meaning."""

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

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


def test_every_shell_and_python_block_says_whether_the_runner_runs_it():
    """tests/e2e/test_readme_runner.py runs the blocks marked `readme-runner: run`; a new
    example must choose (run, or skip with a reason), so none drifts unnoticed."""
    from support import readme

    unmarked = [
        b.line
        for b in readme.blocks()
        if b.language in set(readme.RUNNABLE_LANGUAGES.values()) and b.action is None
    ]
    assert not unmarked, (
        f"README blocks at lines {unmarked} need `<!-- readme-runner: run -->` or "
        f"`<!-- readme-runner: skip (why) -->` on the line above their fence"
    )
    assert len(readme.runnable()) >= 5


def test_the_markers_parse_as_documented():
    from support import readme

    text = (
        "<!-- readme-runner: skip (a cluster) -->\n```sh\nhelm install\n```\n"
        "<!-- readme-runner: run -->\n```python\nprint(1)\n```\n"
        "```sh\nunmarked\n```\n"
        "```\nlayout\n```\n"
    )
    found = readme.blocks(text)
    assert [(b.language, b.line, b.action) for b in found] == [
        ("sh", 3, "skip"),
        ("python", 7, "run"),
        ("sh", 10, None),
        ("", 13, None),
    ]
    assert found[1].code == "print(1)\n"


def _links(path: Path) -> list[str]:
    import re

    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md", "docs/architecture.md"])
def test_links_stay_inside_the_repository_and_resolve(doc):
    root = README.parent
    path = root / doc
    broken = []
    for target in _links(path):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        local = (path.parent / target.split("#")[0]).resolve()
        if not local.is_relative_to(root) or not local.exists():
            broken.append(target)
    assert not broken, f"{doc}: links outside the repository or to nothing: {broken}"
    assert "../shared" not in path.read_text()
