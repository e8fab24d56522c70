"""What the docs name must exist: code paths and modules, commands and their flags; and what the
code registers (reload paths, scenarios) must be in the docs. ``problems(pages)`` lists every
breach, one line each; ``tests/unit/test_docs.py`` requires none."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_DIRS = ("harness", "scenarios", "tests", "benchmarks", "repro", "examples", "docs", "regressions")
# A repository path in text: `harness/x/y.py`, docs/z.md, regressions/ENTRY/patch.diff ...
PATH_RE = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) + r")/[\w./-]*[\w/])")
# A dotted name in the harness: harness.builds.engine_deps.ENGINE_EXTRAS
MODULE_RE = re.compile(r"(?<![\w.])(harness(?:\.\w+)+)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
COMMAND_RE = re.compile(r"refit-harness\s+([a-z][a-z-]*)")
# Paths docs may name that are made at run time, not kept in the repository.
GENERATED = ("docs/img/", "reports/")
# Flags of other programs the docs name (pip, pytest, vllm serve, the repro scripts): a flag
# named alone must be the harness's (a command's or its pytest plugin's) or one of these.
FOREIGN_FLAGS = {
    "--no-deps": "pip",
    "--dry-run": "pip",
    "--report": "pip",
    "--target": "pip",
    "--junitxml": "pytest",
    "--durations": "pytest",
    "--strict": "mkdocs build",
    "--kv-cache-dtype": "vllm serve",
    "--no-enable-prefix-caching": "vllm serve",
    "--api-key": "vllm serve",
    "--uds": "vllm serve",
    "--worker-extension-cls": "vllm serve",
    "--enforce-eager": "vllm serve",
    "--no-amx": "repro/*.py",
    "--as-avx2": "repro/*.py",
    "--refit-drafter": "repro/*.py",
    "--deepseek": "repro/*.py",
    "--bf16-checkpoint": "repro/*.py",
    "--reset-encoder-cache": "repro/*.py",
    "--same-path": "repro/*.py",
    "--float32": "repro/*.py",
    "--cpu-mla": "repro/*.py",
    "--request-amx": "repro/*.py",
    "--float16": "repro/*.py",
    "--long-first": "repro/*.py",
    "--hidden": "repro/*.py",
    "--compiled": "repro/*.py",
    "--probe-isa": "repro/*.py",
}
# A dotted name that is a file, not a module (the traceback log).
FILE_SUFFIXES = ("log", "json", "md", "py", "csv", "html")


def pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"] + sorted((ROOT / "examples").rglob("*.md"))


@cache
def parsers() -> dict[str, set[str]]:
    """Every command and the flags it takes."""
    from harness.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: {f for a in p._actions for f in a.option_strings} for name, p in sub.choices.items()}


def _code(text: str) -> list[str]:
    """Inline code spans and fenced blocks' lines: where docs name paths, modules and commands.
    A ``text`` block is a program's output quoted as it was (a PR's paths in a review): skipped."""
    blocks = [b for lang, b in re.findall(r"```([^\n]*)\n(.*?)```", text, flags=re.S) if lang.strip() != "text"]
    inline = CODE_SPAN.findall(re.sub(r"```.*?```", "", text, flags=re.S))
    return inline + [ln for b in blocks for ln in b.splitlines()]


@cache
def plugin_flags() -> frozenset[str]:
    """The pytest options the harness's plugin adds."""
    source = (ROOT / "harness" / "orchestrate" / "pytest_plugin.py").read_text()
    return frozenset(re.findall(r"addoption\(\s*\"(--[a-z0-9-]+)\"", source))


def _module_exists(dotted: str) -> bool:
    """``harness.a.b[.Name[.attr]]``: a module or package under the repository, then, if any is
    left, a name it defines at its top (a class, function or assignment)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[cut:]
            return not rest or rest[0] in _top_names(module)
    return False


@cache
def _top_names(module: Path) -> frozenset[str]:
    tree = ast.parse(module.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _path_exists(path: str) -> bool:
    path = path.rstrip("/.")
    placeholder = any(Path(part).stem.isupper() for part in path.split("/"))  # docs/findings/NAME.md
    if path.startswith(GENERATED) or placeholder or any(ch in path for ch in "*<>{}$"):
        return True
    return (ROOT / path).exists()


def page_problems(page: Path, text: str | None = None) -> list[str]:
    """What ``page`` names that does not exist."""
    text = page.read_text() if text is None else text
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    out: list[str] = []
    commands = parsers()
    every_flag = set().union(*commands.values()) | plugin_flags() | set(FOREIGN_FLAGS)
    spans = _code(text)
    # A command inside $(...) is one of its own: `run --model $(refit-harness make-model ...) --dtype D`.
    spans = [re.sub(r"\$\([^()]*\)", "X", s) for s in spans] + [
        i for s in spans for i in re.findall(r"\$\(([^()]*)\)", s)
    ]
    for span in spans:
        for path in PATH_RE.findall(span):
            if not _path_exists(path):
                out.append(f"{where}: names {path}, which does not exist")
        for dotted in MODULE_RE.findall(span):
            if dotted.rsplit(".", 1)[1] not in FILE_SUFFIXES and not _module_exists(dotted):
                out.append(f"{where}: names {dotted}, which no harness module defines")
        for cmd in COMMAND_RE.findall(span):
            if cmd not in commands:
                out.append(f"{where}: names the command 'refit-harness {cmd}', which does not exist")
        found = list(COMMAND_RE.finditer(span))
        for m, nxt in zip(found, found[1:] + [None]):  # flags after a command, up to the next one, are its
            for flag in FLAG_RE.findall(span[m.end() : nxt.start() if nxt else None]):
                if m.group(1) in commands and flag not in commands[m.group(1)]:
                    out.append(f"{where}: 'refit-harness {m.group(1)}' takes no {flag}")
        if not found and re.fullmatch(r"--[a-z][a-z0-9-]*(?:[ =].*)?", span.strip()):
            flag = FLAG_RE.match(span.strip()).group(1)  # type: ignore[union-attr]
            if flag not in every_flag:
                out.append(f"{where}: names the flag {flag}, which no command takes")
    return out


def registered_problems() -> list[str]:
    """Registered reload paths missing from docs/paths.md, scenarios missing from docs/scenarios.md."""
    from harness.paths import PATHS
    from scenarios import SCENARIOS

    paths_page = (ROOT / "docs" / "paths.md").read_text()
    scenarios_page = (ROOT / "docs" / "scenarios.md").read_text()
    # Built-in ones only: tests register their own, and an installed package may add paths.
    built_in = [p for p in PATHS.names() if PATHS.get(p).__module__.startswith("harness.paths.")]
    registered = re.findall(r'SCENARIOS\.register\(\s*"([^"]+)"', (ROOT / "scenarios" / "__init__.py").read_text())
    assert set(registered) <= set(SCENARIOS.names()), registered
    out = [f"docs/paths.md leaves out the registered path {p}" for p in built_in if f"`{p}`" not in paths_page]
    out += [
        f"docs/scenarios.md leaves out the registered scenario {s}"
        for s in registered
        if f"`{s}`" not in scenarios_page
    ]
    return out


def problems() -> list[str]:
    return [p for page in pages() for p in page_problems(page)] + registered_problems()
