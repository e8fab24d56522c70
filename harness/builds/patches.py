"""Unified diffs applied to an installed package, strictly: every hunk's old lines must be in
the file as they are (an offset is allowed, fuzz is not), or nothing is written.

A patched build re-injects a bug into an installed vLLM (``refit-harness build --patch``):
a patch that no longer applies must say which file and which hunk, so a vLLM upgrade that
moved the code is one line of error, never a build that silently tests stock code. Parsing
is ``unidiff``'s; applying is here (``unidiff`` only parses).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BuildError


class PatchError(BuildError):
    """A patch that cannot be read or does not apply cleanly (exit 2)."""


@dataclass(frozen=True)
class PatchFile:
    """One unified diff given to a build."""

    name: str
    """The file's name, as given (shown in records and errors)."""
    sha256: str
    """Digest of the diff's bytes: a patched build is keyed by these."""
    text: str
    """The diff itself."""


def read_patch(path: str | Path) -> PatchFile:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PatchError(f"--patch {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise PatchError(f"--patch {path}: not a text file") from None
    return PatchFile(str(path), hashlib.sha256(data).hexdigest(), text)


def patches_digest(patches: tuple[PatchFile, ...]) -> str:
    """One digest for patches in order (order matters: later hunks see earlier edits)."""
    return hashlib.sha256("\n".join(p.sha256 for p in patches).encode()).hexdigest()


def touched_files(patch: PatchFile) -> tuple[str, ...]:
    """Paths (relative to the site directory, ``vllm/...``) a patch edits."""
    return tuple(_relative(f.path, patch) for f in parse_diff(patch))


def apply_patches(root: Path, patches: tuple[PatchFile, ...], resolve=lambda p: p) -> tuple[str, ...]:
    """Apply every patch to the files under ``root`` (paths as ``a/vllm/x.py``, stripped of one
    component). ``resolve(path)`` gives the file to read for a path not yet written (a
    symlink's target in an overlay). All patches are checked before any file is written.
    Returns the relative paths written."""
    contents: dict[str, list[str]] = {}
    for patch in patches:
        for pf in parse_diff(patch):
            rel = _relative(pf.path, patch)
            if pf.is_added_file or pf.is_removed_file:
                raise PatchError(f"--patch {patch.name}: {rel}: adding or removing files is not supported")
            if rel not in contents:
                target = root / rel
                try:
                    contents[rel] = Path(resolve(target)).read_text().splitlines(keepends=True)
                except OSError:
                    raise PatchError(f"--patch {patch.name}: {rel}: no such file in the installed package") from None
            contents[rel], _ = apply_file(contents[rel], pf, f"--patch {patch.name}: {rel}")
    for rel, lines in contents.items():
        target = root / rel
        if target.is_symlink():
            target.unlink()
        target.write_text("".join(lines))
    return tuple(contents)


def apply_file(lines: list[str], pf, where: str, fuzz: int = 0) -> tuple[list[str], tuple[int, ...]]:
    """One file's hunks (``unidiff.PatchedFile``) applied to its lines, in memory. A hunk whose
    old lines are not in the file fails (``PatchError`` naming ``where`` and the hunk), unless
    ``fuzz`` allows dropping up to that many of its leading and trailing context lines, as
    ``patch --fuzz`` does. Returns the new lines and the numbers of the hunks that needed fuzz."""
    lines = list(lines)
    shift, fuzzed = 0, []
    for number, hunk in enumerate(pf, 1):
        body = [ln for ln in hunk]
        for f in range(fuzz + 1):
            head = _context_run(body, f)
            tail = _context_run(body[::-1], f)
            kept = body[head : len(body) - tail]
            old = [ln.value for ln in kept if ln.is_context or ln.is_removed]
            new = [ln.value for ln in kept if ln.is_context or ln.is_added]
            at = _find(lines, old, hunk.source_start - 1 + head + shift)
            if at is not None:
                break
        if at is None:
            header = f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
            raise PatchError(
                f"{where}: hunk #{number} ({header}) does not apply: its {len(old)} old line(s) are not in the file"
            )
        if f:
            fuzzed.append(number)
        lines[at : at + len(old)] = new
        shift = at - (hunk.source_start - 1 + head) + (len(new) - len(old))
    return lines, tuple(fuzzed)


def _context_run(body: list, most: int) -> int:
    """How many of the first ``most`` lines of a hunk body are context (what fuzz may drop)."""
    n = 0
    while n < most and n < len(body) and body[n].is_context:
        n += 1
    return n


def _find(lines: list[str], old: list[str], hint: int) -> int | None:
    """Where ``old`` starts in ``lines``: at ``hint`` if it is there, else the nearest place."""
    n = len(old)
    if n == 0:
        return max(0, min(hint, len(lines)))
    starts = [i for i in range(len(lines) - n + 1) if lines[i : i + n] == old]
    if not starts:
        return None
    return min(starts, key=lambda i: abs(i - hint))


def parse_diff(patch: PatchFile):
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch.text)
    except UnidiffParseError as exc:
        raise PatchError(f"--patch {patch.name}: not a unified diff ({exc})") from None
    if not len(files):
        raise PatchError(f"--patch {patch.name}: no file in this diff")
    return files


def _relative(path: str, patch: PatchFile) -> str:
    parts = Path(path).parts  # unidiff strips a/ and b/ already; a bare "x/vllm/..." loses its first part
    rel = Path(path) if parts[:1] == ("vllm",) else Path(*parts[1:]) if len(parts) > 1 else Path(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] != "vllm":
        raise PatchError(f"--patch {patch.name}: {path}: a patch edits files under vllm/ only (a/vllm/..., b/vllm/...)")
    return str(rel)
