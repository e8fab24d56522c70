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
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Evidence = Literal["tensor", "kernel_input", "tokens", "logprobs"]
"""Kinds of evidence a FAIL can rest on: a census tensor (STALE/CORRUPT/...), a recorded kernel
input, a greedy-token divergence, or logprobs beyond the noise floor."""
EVIDENCE_KINDS: tuple[Evidence, ...] = ("tensor", "kernel_input", "tokens", "logprobs")
VERDICTS = ("PASS", "FAIL", "XFAIL", "INCONCLUSIVE", "ERROR", "SKIPPED", "XPASS")
ENTRY_FILE = "entry.toml"


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


class Expectation(_Frozen):
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
    reason: str = ""
    """Why it is missed (or why the evidence is what it is); required for a miss."""

    @field_validator("patched", "stock")
    @classmethod
    def _verdict(cls, v: str) -> str:
        if v not in VERDICTS:
            raise ValueError(f"verdict {v!r}: one of {', '.join(VERDICTS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Expectation:
        if self.caught and (self.patched != "FAIL" or not self.evidence):
            raise ValueError("a caught bug FAILs on the patched build and names its evidence")
        if not self.caught and not self.reason:
            raise ValueError("a miss says why (reason)")
        if self.tensor is not None:
            re.compile(self.tensor)
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
    patches: tuple[str, ...] = ("patch.diff",)
    """Unified diffs in the entry directory, applied in order to the installed vLLM; empty for a
    bug that stock 0.32 still has (nothing to re-inject; the entry then does not run)."""
    exposure: Exposure
    """The model and path(s) that expose it."""
    expect: Expectation
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
        if not self.patches and self.run:
            raise ValueError("an entry without a patch (a bug stock vLLM still has) cannot run: set run = false")
        return self

    def patch_files(self) -> tuple[Path, ...]:
        return tuple(Path(self.directory) / p for p in self.patches)


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
