"""No harness modules import each other, at any level: no pair, and no longer circle.

The import contracts (``lint-imports``) see packages and layers; an import inside a function
escapes a reader's eye all the same, and modules that reach into each other make one module
in several files. This reads every module's syntax tree (imports at the top, inside functions,
under ``TYPE_CHECKING``) and names each group of modules that import one another in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "harness"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (a package by its own name)."""
    names = {}
    for file in sorted(root.rglob("*.py")):
        parts = list(file.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = file
    return names


def imported_modules(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``file`` (module ``name``) imports anywhere in its body."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in known else base)  # a submodule, or a name from ``base``
    return {m for m in found if m in known and m != name}


def import_cycles(root: Path) -> list[tuple[str, ...]]:
    """Each group of modules under ``root`` that import one another in a circle (a pair that
    imports both ways is a group of two), each sorted, the groups sorted."""
    known = module_names(root)
    edges = {name: imported_modules(name, file, known) for name, file in known.items()}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reached = {name: reach(name) for name in edges}
    groups = {tuple(sorted({a} | {b for b in reached[a] if a in reached[b]})) for a in edges if a in reached[a]}
    return sorted(groups)


def test_no_harness_modules_import_each_other():
    cycles = import_cycles(HARNESS)
    assert not cycles, "modules that import one another:\n" + "\n".join("  " + " <-> ".join(c) for c in cycles)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_pair_hidden_in_functions_is_found(tmp_path):
    """The planted bug: one side imports at the top, the other inside a function, relatively."""
    root = _package(
        tmp_path,
        {
            "sub/__init__.py": "",
            "sub/a.py": "from pkg.sub.b import helper\n",
            "sub/b.py": "def helper():\n    from . import a\n    return a\n",
            "c.py": "import pkg.sub.a\n",
        },
    )
    assert import_cycles(root) == [("pkg.sub.a", "pkg.sub.b")]


def test_a_circle_of_three_is_found(tmp_path):
    """The planted bug a pair check misses: a -> b -> c -> a, the last inside a function."""
    root = _package(
        tmp_path,
        {
            "a.py": "import pkg.b\n",
            "b.py": "from pkg import c\n",
            "c.py": "def f():\n    from pkg.a import X\n",
            "d.py": "import pkg.a\n",
        },
    )
    assert import_cycles(root) == [("pkg.a", "pkg.b", "pkg.c")]


def test_a_one_way_chain_is_no_pair(tmp_path):
    """The twin: the same modules importing one way only (and a package importing its own
    child, which is not a mutual import unless the child imports it back)."""
    root = _package(
        tmp_path,
        {
            "sub/__init__.py": "from pkg.sub import a\n",
            "sub/a.py": "from pkg.sub.b import helper\n",
            "sub/b.py": "def helper():\n    import pkg.c\n",
            "c.py": "X = 1\n",
        },
    )
    assert import_cycles(root) == []
