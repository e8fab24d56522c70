"""``RunDir`` owns the output directory's layout: no file name of it is spelled elsewhere in the
harness or the scenarios, and the names on disk are the ones earlier versions wrote."""

from __future__ import annotations

import ast
from pathlib import Path

from harness import run_dir
from harness.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "harness", ROOT / "scenarios")
"""Where no output file name may be spelled but in ``harness/run_dir.py``."""
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


def _spells(text: str, name: str) -> bool:
    """Whether ``text`` holds ``name`` as a file name: not inside a longer name (``my_run.json``
    is not ``run.json``); an arm file suffix (``.result.json``) after anything."""
    at = text.find(name)
    while at != -1:
        before, after = text[at - 1 : at], text[at + len(name) : at + len(name) + 1]
        inside = before.isalnum() or before in ("_", "-", ".") if before else False
        if (name.startswith(".") or not inside) and not (after.isalnum() or after in ("_", "-")):
            return True
        at = text.find(name, at + 1)
    return False


def spelled_names(root: Path, names: frozenset[str], owner: Path | None = None) -> list[str]:
    """``file:line: text`` for each string literal (f-string parts included, docstrings not)
    under ``root`` that spells one of ``names`` (as a path, in a message or in a help text),
    outside ``owner``."""
    found = []
    for file in sorted(root.rglob("*.py")):
        if file.resolve() == owner:
            continue
        tree = ast.parse(file.read_text(), str(file))
        skip = _docstrings(tree)
        literals = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        for node in sorted(literals, key=lambda n: (n.lineno, n.col_offset)):
            if id(node) not in skip and any(_spells(node.value, n) for n in names):
                found.append(f"{file.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_output_file_name_is_spelled_outside_run_dir():
    assert all(root.is_dir() for root in SOURCES), SOURCES
    spelled = [s for root in SOURCES for s in spelled_names(root, run_dir.FILE_NAMES, OWNER)]
    assert not spelled, "spell these through harness.run_dir:\n" + "\n".join(spelled)


def test_a_spelled_name_is_found_and_a_docstring_is_not(tmp_path):
    """The planted bug: the record's name in code, and in an f-string; the twin: in a docstring."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "bad.py").write_text(
        'RECORD = "run.json"\ndef f(d):\n    return f"{d}.result.json"\n'
        'def g(d):\n    raise ValueError(f"{d} has no summary.json")\n'
        'HELP = "the directory or its index.html; see arm.result.json"\n'
    )
    (pkg / "fine.py").write_text(
        '"""Reads run.json."""\n\ndef g():\n    """summary.json, by name."""\n'
        'OTHER = ("my_run.json", "run.json5", "preflight.json-schema")\n'
    )
    assert spelled_names(pkg, run_dir.FILE_NAMES) == [
        "pkg/bad.py:1: 'run.json'",
        "pkg/bad.py:3: '.result.json'",
        "pkg/bad.py:5: ' has no summary.json'",
        "pkg/bad.py:6: 'the directory or its index.html; see arm.result.json'",
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
