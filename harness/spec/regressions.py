"""The regression corpus: vLLM's own fixed refit bugs, re-injected as patches (``regressions/<id>/``).

Each entry directory holds ``entry.toml`` (validated here) and its patch(es). An entry says which
upstream bug it is, how the patch brings it back, which model and reload path expose it on this
device, and what the harness is expected to conclude: the patched build FAILs naming the evidence
(a tensor, a kernel input, tokens, logprobs) and stock PASSes; or, where the harness cannot catch
it here, the verdict it actually reaches and why. Pure data: no torch, no vLLM.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Evidence = Literal["tensor", "kernel_input", "tokens", "logprobs", "error"]
"""Kinds of evidence a failure can rest on: a census tensor (STALE/CORRUPT/...), a recorded kernel
input, a greedy-token divergence, logprobs beyond the noise floor, or the refit's own error (a bug
that fails loudly: the verdict is ERROR, or XFAIL by a known issue, with vLLM's words)."""
EVIDENCE_KINDS: tuple[Evidence, ...] = ("tensor", "kernel_input", "tokens", "logprobs", "error")
VERDICTS = ("PASS", "FAIL", "XFAIL", "INCONCLUSIVE", "ERROR", "SKIPPED", "XPASS")
FAILING_VERDICTS = ("FAIL", "ERROR", "XFAIL")
"""Verdicts a caught entry can get on its patched build: FAIL; ERROR when the bug is loud (its
evidence is then ``error``); XFAIL for a live bug that a known issue of the path names."""
ENTRY_FILE = "entry.toml"
Fidelity = Literal["faithful", "stand-in"]
"""``faithful``: the patch takes out what the upstream fix put in (the same function, the same
mechanism); ``stand-in``: it brings back the symptom by other code, said in ``fidelity_note``."""


def _specifier(text: str):
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"{text!r} is not a version specifier (e.g. '<0.34', '>=0.34')") from None


def version_in(version: str, specifier: str) -> bool:
    """Whether a vLLM version (``0.32.0``, ``0.34.1.dev5+gabc``, ``0.32.0+cpu``) is in a specifier;
    a development build of main counts as the release it leads to."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(Version(version).base_version)  # 0.34.0.dev3+gabc and 0.34.0+cpu are 0.34.0
    except InvalidVersion:
        return False
    return _specifier(specifier).contains(release)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Upstream(_Frozen):
    """Where the bug and its fix are public."""

    fix: str
    """The fix PR's address (github.com/vllm-project/vllm/pull/N)."""
    issue: str = ""
    """The issue or report that named the bug, when it is not the PR itself."""
    status: str = "merged"
    """The fix's state upstream as read (``merged``, or ``open``/``closed`` with the 0.32 code that
    does the same named in ``mechanism``)."""


class Exposure(_Frozen):
    """What exposes the bug here."""

    model: str
    """``tiny-qwen3``, ``zoo:<family>``, ``fixture:<Architecture>`` (the tiny Qwen3 as a fixture
    class) or ``fp8kv:<base>`` (``base`` with an fp8 KV cache and checkpoint k/v scales)."""
    paths: tuple[str, ...]
    """Reload paths to run (registered names)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Engine dtype."""

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v == "tiny-qwen3" or re.fullmatch(r"(zoo|fixture|fp8kv):[A-Za-z0-9_.-]+", v):
            return v
        raise ValueError(f"model {v!r}: use tiny-qwen3, zoo:<family>, fixture:<Architecture> or fp8kv:<base>")


class EntryExpectation(_Frozen):
    """What the harness is expected to conclude, patched and stock."""

    caught: bool
    """Whether the harness catches the re-injected bug here (counts toward recall)."""
    patched: str
    """Verdict of every exposed path on the patched build."""
    stock: str = "PASS"
    """Verdict of the same paths on stock vLLM."""
    evidence: tuple[Evidence, ...] = ()
    """For a caught bug: the kinds of evidence the patched FAIL must rest on, every one of them
    (it may rest on more)."""
    tensor: str | None = None
    """A regular expression a failing tensor or kernel input of the patched run must match."""
    error: str | None = None
    """For ``error`` evidence: a regular expression the refit's error must match, vLLM's own words
    (so a harness failure is never taken for the bug)."""
    reason: str = ""
    """Why it is missed (or why the evidence is what it is); required for a miss."""

    @field_validator("patched", "stock")
    @classmethod
    def _verdict(cls, v: str) -> str:
        if v not in VERDICTS:
            raise ValueError(f"verdict {v!r}: one of {', '.join(VERDICTS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> EntryExpectation:
        if self.caught and (self.patched not in FAILING_VERDICTS or not self.evidence):
            raise ValueError(
                "a caught bug FAILs on the patched build (ERROR for a loud one, XFAIL for a live bug a known "
                "issue names) and names its evidence"
            )
        if not self.caught and not self.reason:
            raise ValueError("a miss says why (reason)")
        if self.tensor is not None:
            re.compile(self.tensor)
        if "error" in self.evidence and not self.error:
            raise ValueError("error evidence names the words the error must have (error = 'regex')")
        if self.error is not None:
            re.compile(self.error)
        return self


class Entry(_Frozen):
    """One re-injected upstream bug."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{2,60}$")
    """The directory name, e.g. ``44814-composed-loader-double-count``."""
    title: str
    """One line: what the bug does."""
    mechanism: str
    """How it goes wrong, and what the patch takes out of 0.32 to bring it back."""
    upstream: Upstream
    """The public bug and fix."""
    fidelity: Fidelity
    """Whether the patch re-injects what shipped (``faithful``) or only its symptom (``stand-in``)."""
    fidelity_note: str
    """Why: the function and lines the patch reverts, or what it does instead and why."""
    patches: tuple[str, ...] = ("patch.diff",)
    """Unified diffs in the entry directory, applied in order to the installed vLLM; empty for a
    bug that stock vLLM still has (a live bug: nothing to re-inject, the entry runs stock vLLM,
    and a known issue of the path may expect its failure, XFAIL)."""
    applies: dict[str, str] = {}
    """Patch file -> the vLLM versions it applies to (a PEP 440 specifier such as ``<0.34``); a
    patch not named here applies to every version. A version that no patch is declared for is
    SKIPPED, as is one whose patch does not apply."""
    masked: dict[str, str] = {}
    """Version specifier -> why the re-injected bug cannot show on those versions (another change
    of theirs hides it): the entry is reported masked there and left out of recall."""
    exposure: Exposure
    """The model and path(s) that expose it."""
    expect: EntryExpectation
    """What the harness concludes."""
    run: bool = True
    """False where the patched code cannot execute on this device at all: the patch is still
    built (it must apply), no engine is started, and the entry is a miss with ``expect.reason``."""
    directory: str = ""
    """Where the entry was read from (filled in by ``load_corpus``)."""

    @model_validator(mode="after")
    def _runnable(self) -> Entry:
        if not self.run and self.expect.caught:
            raise ValueError("an entry that does not run cannot be caught")
        for name, spec in self.applies.items():
            if name not in self.patches:
                raise ValueError(f"applies: {name!r} is not one of the entry's patches")
            _specifier(spec)
        for spec in self.masked:
            _specifier(spec)
        if self.fidelity == "stand-in" and not self.fidelity_note.strip():
            raise ValueError("a stand-in says what it does instead of the shipped bug (fidelity_note)")
        return self

    @property
    def live(self) -> bool:
        """A bug stock vLLM still has: no patch, the stock run is the one judged."""
        return not self.patches

    def patch_files(self, version: str | None = None) -> tuple[Path, ...]:
        """The entry's patches, or those declared for a vLLM ``version``."""
        names = [
            p for p in self.patches if version is None or p not in self.applies or version_in(version, self.applies[p])
        ]
        return tuple(Path(self.directory) / p for p in names)

    def unsupported(self, version: str) -> str:
        """Why no patch of this entry is declared for ``version`` ("" when one is, or none is needed)."""
        if not self.patches or self.patch_files(version):
            return ""
        declared = ", ".join(f"{p} for {self.applies.get(p, 'every version')}" for p in self.patches)
        return f"no patch is declared for vLLM {version} ({declared})"

    def masked_on(self, version: str) -> str:
        """Why the bug cannot show on ``version`` ("" when it can)."""
        return next((why for spec, why in self.masked.items() if version_in(version, spec)), "")


def load_entry(directory: Path) -> Entry:
    f = directory / ENTRY_FILE
    try:
        data = tomllib.loads(f.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{f}: cannot read the corpus entry ({exc})") from None
    try:
        entry = Entry(**data, directory=str(directory))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"{f}: {where}: {first['msg']}") from None
    if entry.id != directory.name:
        raise UsageError(f"{f}: id {entry.id!r} is not its directory's name {directory.name!r}")
    for p in entry.patch_files():
        if not p.is_file():
            raise UsageError(f"{f}: patch {p.name} is not in the entry's directory")
    return entry


def load_corpus(root: Path) -> tuple[Entry, ...]:
    """Every entry under ``root`` (one directory each), in name order."""
    if not root.is_dir():
        raise UsageError(f"{root}: no regression corpus here")
    entries = tuple(load_entry(d) for d in sorted(root.iterdir()) if (d / ENTRY_FILE).is_file())
    if not entries:
        raise UsageError(f"{root}: the regression corpus has no entry")
    return entries


@dataclass(frozen=True)
class RegressionsSpec:
    """The regression corpus as a scenario (``refit-harness run -s regressions``)."""

    name: str
    """Registry name."""
    description: str
    """One line for ``refit-harness list``."""
    corpus: str
    """Directory holding one sub-directory per entry."""
