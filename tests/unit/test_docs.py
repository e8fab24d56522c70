"""The pages generated from the code match their generators, and the README stays a page a
newcomer reads (its reference lives in docs/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_a_generated_page_matches_its_generator(page):
    assert (ROOT / page).read_text() == reference.PAGES[page](), f"{page} is stale: run `make docs`"


def test_the_cli_reference_names_every_command_and_flag():
    from harness.cli import build_parser

    text = reference.cli_reference()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        assert f"## `refit-harness {name}`" in text
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (name, flag)


def test_the_readme_is_at_most_10_kb_and_links_only_pages_that_exist():
    import re

    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 10 * 1024
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target
    assert "make run" in readme and "make test" in readme
