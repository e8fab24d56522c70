"""A PR's diff, split into what can be tested on an installed vLLM and what cannot.

A real vLLM PR touches more than the ``vllm/`` package a wheel installs: tests, docs, C++ and
CUDA sources, new files, packaging. And it is written against main, not against the release
installed here. ``split_diff`` takes each file of the diff in turn:

- a file of the installed ``vllm/`` package whose every hunk applies (exactly, or within
  ``fuzz`` context lines when asked) goes into the *testable* diff, rewritten as an exact diff
  against the installed file, so the patched build (``harness.builds.patched.create_patched_build``)
  applies it without fuzz;
- everything else is left out, each file with the reason: tests and docs (not installed),
  C++/CUDA sources (compiled into the wheel's binaries: a source build is needed), new or
  removed files (a patched build edits the files the package has), files of the package this
  release does not have, and hunks that do not apply to it.

Stdlib and ``unidiff`` only, as the rest of ``harness.builds``.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.builds.patches import PatchError, PatchFile, apply_file, parse_diff

COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".cmake")
DOC_SUFFIXES = (".md", ".rst", ".txt", ".png", ".svg")


@dataclass(frozen=True)
class DiffPart:
    """One file of a PR's diff, and what the review did with it."""

    path: str
    """The file's path in the PR (``vllm/...``, ``tests/...``, ``csrc/...``)."""
    applied: bool
    """In the testable diff (applied to the installed vLLM of the PR build)."""
    reason: str
    """Why it was left out; for an applied file, how it applied (exactly, or with fuzz)."""


@dataclass(frozen=True)
class SplitDiff:
    """A PR's diff as the review sees it."""

    parts: tuple[DiffPart, ...]
    """Every file of the diff, in its order."""
    testable: PatchFile | None
    """The files that apply, as one exact diff against the installed vLLM; None: nothing testable."""
    fuzz: int
    """Context lines a hunk was allowed to drop (0: exact only)."""

    @property
    def left_out(self) -> tuple[DiffPart, ...]:
        return tuple(p for p in self.parts if not p.applied)


def _left_out_reason(path: PurePosixPath) -> str | None:
    """Why a file outside the installed package cannot be tested here; None for ``vllm/``."""
    top = path.parts[0] if path.parts else ""
    if top == "vllm":
        return None
    if top == "tests" or path.name.startswith("test_"):
        return "a test: not part of the installed vllm/ package (the harness's own checks stand in for it)"
    if top == "docs" or path.suffix in DOC_SUFFIXES:
        return "documentation: not part of the installed vllm/ package"
    if top in ("csrc", "cmake") or path.suffix in COMPILED_SUFFIXES or path.name == "CMakeLists.txt":
        return (
            "C++/CUDA source: compiled into the wheel's _C extensions, which a patched build cannot change; "
            "test it with a source build (refit-harness build pr --vllm CHECKOUT)"
        )
    return "not in the installed vllm/ package (build, packaging or CI file)"


def split_diff(patch: PatchFile, vllm_root: Path, fuzz: int = 0, vllm_version: str = "") -> SplitDiff:
    """Split ``patch`` against the installed vLLM at ``vllm_root`` (its ``vllm/`` directory)."""
    release = f"the installed vLLM {vllm_version}".strip() if vllm_version else "the installed vLLM"
    parts: list[DiffPart] = []
    chunks: list[str] = []
    for pf in parse_diff(patch):
        name = pf.target_file if pf.is_added_file else pf.source_file
        path = PurePosixPath(name.split("/", 1)[1] if name.startswith(("a/", "b/")) else name)
        why = _left_out_reason(path)
        if why is not None:
            parts.append(DiffPart(str(path), False, why))
            continue
        if pf.is_added_file:
            parts.append(
                DiffPart(str(path), False, "a new file: a patched build only edits files the installed package has")
            )
            continue
        if pf.is_removed_file:
            parts.append(DiffPart(str(path), False, "a removed file: a patched build does not remove files"))
            continue
        installed = vllm_root.parent / path
        if not installed.is_file():
            parts.append(DiffPart(str(path), False, f"not in {release} (a file added or moved on main)"))
            continue
        before = installed.read_text().splitlines(keepends=True)
        try:
            after, fuzzed = apply_file(before, pf, str(path), fuzz)
        except PatchError as exc:
            hint = "" if fuzz else "; --fuzz N lets a hunk drop up to N context lines"
            parts.append(DiffPart(str(path), False, f"does not apply to {release}: {str(exc).split(': ', 1)[1]}{hint}"))
            continue
        how = f"applies with fuzz (hunk(s) {', '.join(map(str, fuzzed))})" if fuzzed else "applies exactly"
        parts.append(DiffPart(str(path), True, how))
        chunks.append("".join(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}")))
    if not chunks:
        return SplitDiff(tuple(parts), None, fuzz)
    text = "".join(chunks)
    name = f"{Path(patch.name).name} (testable part)"
    return SplitDiff(tuple(parts), PatchFile(name, hashlib.sha256(text.encode()).hexdigest(), text), fuzz)


def review_markdown(split: SplitDiff, diff_name: str) -> list[str]:
    """What the review tested of the diff and what it left out, for summary.md."""
    lines = [f"### What `{diff_name}` changed that was tested", ""]
    if split.fuzz:
        lines += [f"Hunks were allowed to drop up to {split.fuzz} context line(s) (`--fuzz {split.fuzz}`).", ""]
    lines += [f"- {'applied' if p.applied else 'left out'}: `{p.path}`: {p.reason}" for p in split.parts]
    if split.testable is None:
        lines += ["", "**Nothing testable changed**: no file of the installed vllm/ package is changed by this diff."]
    return lines + [""]
