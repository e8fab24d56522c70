"""The one exit-code policy: verdicts (and comparisons' expectations) -> the CLI's exit code.

0: nothing failed (PASS, SKIPPED, XFAIL); 1: a verdict that fails the run (FAIL,
INCONCLUSIVE, XPASS: a known issue gone), or an expectation not met; 2: an engine could not
run (ERROR). Bad usage is also 2, decided where it is detected.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.judge.verdict import VerdictStatus

OK, FAILED, INFRASTRUCTURE = 0, 1, 2

FAILING_VERDICTS = frozenset({VerdictStatus.FAIL, VerdictStatus.INCONCLUSIVE, VerdictStatus.XPASS})
"""Verdicts that fail the run (exit 1)."""
BAD = FAILING_VERDICTS | {VerdictStatus.ERROR}
"""Verdicts that make the exit code non-zero."""


def for_verdicts(statuses: Iterable[VerdictStatus]) -> int:
    """The exit code of one run's verdicts: an ERROR wins, then a failing verdict."""
    seen = set(statuses)
    if VerdictStatus.ERROR in seen:
        return INFRASTRUCTURE
    return FAILED if seen & FAILING_VERDICTS else OK


def for_expectations(met: Iterable[bool]) -> int:
    """The exit code of a comparison of builds: 1 unless every expectation is met."""
    return OK if all(met) else FAILED


def combined(codes: Iterable[int], deciding: Iterable[int] | None = None) -> int:
    """The exit code of several runs: an engine that could not run (2) in any of them wins;
    otherwise the worst of ``deciding`` (e.g. the comparisons' codes, when expectations
    decide), or of ``codes`` themselves."""
    codes = list(codes)
    if INFRASTRUCTURE in codes:
        return INFRASTRUCTURE
    return max(codes if deciding is None else deciding, default=OK)
