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


# ---- docs that stay true: what they name exists, what the code registers is in them -----------


def test_every_doc_names_only_what_exists_and_every_registered_path_and_scenario():
    from tests.doc_truth import problems

    assert problems() == []


@pytest.mark.parametrize(
    "planted, found",
    [
        ("Digests are in `harness/perturb.py`.", "names harness/perturb.py, which does not exist"),
        ("One classifier (`harness.judge.diff.classify_all`).", "names harness.judge.diff.classify_all"),
        ("```bash\nrefit-harness run --model M --sabotage-all\n```", "'refit-harness run' takes no --sabotage-all"),
        ("Then `refit-harness reviews pr.diff`.", "the command 'refit-harness reviews', which does not exist"),
        ("Pass `--no-twins` to save time.", "names the flag --no-twins, which no command takes"),
    ],
)
def test_a_planted_dead_name_in_a_doc_is_found(tmp_path, planted, found):
    from tests.doc_truth import page_problems

    page = tmp_path / "planted.md"
    page.write_text(f"# A page\n\n{planted}\n")
    assert any(found in p for p in page_problems(page)), page_problems(page)
    page.write_text("# A page\n\n`harness/builds/review.py`, `harness.judge.diff.classify`, `refit-harness review`.\n")
    assert page_problems(page) == []


def test_a_registered_path_left_out_of_the_paths_page_is_found(monkeypatch):
    import tests.doc_truth as truth

    real = Path.read_text

    def without_raw(self, *a, **k):
        text = real(self, *a, **k)
        return text.replace("`raw_load_weights`", "raw") if self.name == "paths.md" else text

    monkeypatch.setattr(Path, "read_text", without_raw)
    assert "docs/paths.md leaves out the registered path raw_load_weights" in truth.registered_problems()
