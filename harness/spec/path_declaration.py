"""What the judge reads of a reload path: the declarations a path class makes about itself
(how its sabotage shows, its known issues, vLLM's refusals of it), as a protocol.

The path classes (``harness.paths``) satisfy it; the judge takes a lookup of them from its
caller (``harness.judge.evaluate.evaluate(out, PATHS.get)``), so that it never imports the
paths, which belong to the arm's side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from harness.spec.known_issues import KnownIssue, Refusal, Subject

SabotageEvidence = Literal["tensor", "tokens", "drafter", "encoder_cache"]
"""How a caught sabotage shows: ``tensor``, the left-out tensor (or its module's kernel) fails;
``tokens``, greedy tokens diverge from cold B; ``drafter``, a tensor of the speculative-decoding
drafter fails (``records.DRAFTER_PREFIX``), while the target's do not; ``encoder_cache``, image
embeddings the engine served after the refit differ from cold B's."""


@runtime_checkable
class PathDeclaration(Protocol):
    """A reload path as the judge sees it: a ``harness.paths.base.ReloadPath`` subclass (the
    class itself, not an instance)."""

    trains: bool
    """A live trainer makes its targets: one verdict per optimizer step."""
    refusals: tuple[Refusal, ...]
    """Errors by which vLLM declines this refit by design on a device (SKIPPED with vLLM's words)."""
    sabotage: str
    """What the path's sabotaged twin breaks."""
    sabotage_evidence: SabotageEvidence
    """How a caught sabotage shows: a failing tensor, diverging greedy tokens, a failing drafter tensor."""
    needs_cache_hits: bool
    """The path is meaningful only if the prefix cache served tokens after its refit."""

    def known_issues_for(self, subject: Subject) -> tuple[KnownIssue, ...]:
        """Every known issue expected for ``subject`` having run this path."""
        ...


PathLookup = Callable[[str], PathDeclaration]
"""A path's name -> its declaration (``harness.paths.PATHS.get``)."""
