"""No function in ``harness/orchestrate/`` is over 60 lines: the orchestrator reads as named steps.

Counted from the ``def`` line to the last line of the body, docstring and comments included
(decorators not); methods and functions nested in others count on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ORCHESTRATE = Path(__file__).resolve().parents[2] / "harness" / "orchestrate"
LIMIT = 60


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """``FILE:LINE NAME (N lines)`` of every function under ``root`` longer than ``limit`` lines."""
    found = []
    for file in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{file.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_orchestrate_is_over_60_lines():
    assert ORCHESTRATE.is_dir() and list(ORCHESTRATE.glob("*.py"))
    assert long_functions(ORCHESTRATE) == []


def test_a_long_function_is_caught_and_a_short_one_passes(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "short.py").write_text("def short():\n" + body[: -len("    x59 = 59\n")])  # 60 lines
    (tmp_path / "nested.py").write_text(
        "class Runner:\n    def run(self):\n        async def inner():\n"
        + body.replace("    ", "            ")
        + "        return inner\n"
    )
    (tmp_path / "long.py").write_text("def long():\n" + body)  # 61 lines
    assert long_functions(tmp_path) == [
        "long.py:1 long (61 lines)",
        "nested.py:2 run (63 lines)",
        "nested.py:3 inner (61 lines)",
    ]
