"""``RunDir`` owns the output directory's layout: no file name of it is spelled elsewhere in the
harness, and the names on disk are the ones earlier versions wrote."""

from __future__ import annotations

import ast
from pathlib import Path

from harness import run_dir
from harness.run_dir import RunDir

HARNESS = Path(__file__).resolve().parents[2] / "harness"
OWNER = Path(run_dir.__file__).resolve()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (of a module, a class, a function, a field)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    out.add(id(stmt.value))
    return out


def spelled_names(root: Path, names: frozenset[str], owner: Path | None = None) -> list[str]:
    """``file:line: name`` for each string literal (f-string parts included, docstrings not)
    under ``root`` that is one of ``names``, or ends with one, outside ``owner``."""
    found = []
    for file in sorted(root.rglob("*.py")):
        if file.resolve() == owner:
            continue
        tree = ast.parse(file.read_text(), str(file))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value
                if any(text == n or (text.endswith(n) and text[: -len(n)].endswith(("/", "}"))) for n in names):
                    found.append(f"{file.relative_to(root.parent)}:{node.lineno}: {text!r}")
    return found


def test_no_output_file_name_is_spelled_outside_run_dir():
    spelled = spelled_names(HARNESS, run_dir.FILE_NAMES, OWNER)
    assert not spelled, "spell these through harness.run_dir:\n" + "\n".join(spelled)


def test_a_spelled_name_is_found_and_a_docstring_is_not(tmp_path):
    """The planted bug: the record's name in code, and in an f-string; the twin: in a docstring."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "bad.py").write_text('RECORD = "run.json"\ndef f(d):\n    return f"{d}.result.json"\n')
    (pkg / "fine.py").write_text('"""Reads run.json."""\n\ndef g():\n    """summary.json, by name."""\n')
    assert spelled_names(pkg, run_dir.FILE_NAMES) == [
        "pkg/bad.py:1: 'run.json'",
        "pkg/bad.py:3: '.result.json'",
    ]


def test_the_names_on_disk_are_the_ones_records_were_written_under(tmp_path):
    """Runs written before ``RunDir`` existed must still load: the same names, the same places."""

    class Arm:
        name = "subject-reload_weights"

    d = RunDir(tmp_path)
    files = d.arm(Arm())
    assert (d.record.name, d.summary_json.name, d.summary_md.name, d.index_html.name) == (
        "run.json",
        "summary.json",
        "summary.md",
        "index.html",
    )
    assert (files.plan, files.result, files.log, files.scratch) == (
        tmp_path / "arms" / "subject-reload_weights.plan.json",
        tmp_path / "arms" / "subject-reload_weights.result.json",
        tmp_path / "arms" / "subject-reload_weights.log",
        tmp_path / "scratch" / "subject-reload_weights",
    )
    assert run_dir.RUN_TABLES == ("tensors.csv", "tokens.csv", "consumed.csv", "hooks.csv", "accuracy.csv")
