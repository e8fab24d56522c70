"""The one exit-code policy, as the README's table states it."""

from __future__ import annotations

import pytest

from harness.judge import exit_codes
from harness.judge.verdict import VerdictStatus as S


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ((), 0),
        ((S.PASS, S.SKIPPED, S.XFAIL), 0),
        ((S.PASS, S.FAIL), 1),
        ((S.INCONCLUSIVE,), 1),
        ((S.XPASS, S.XFAIL), 1),
        ((S.ERROR,), 2),
        ((S.FAIL, S.ERROR, S.PASS), 2),
    ],
)
def test_verdicts_to_exit_code(statuses, code):
    assert exit_codes.for_verdicts(statuses) == code


def test_every_verdict_is_either_good_or_bad():
    assert exit_codes.BAD == {S.FAIL, S.INCONCLUSIVE, S.XPASS, S.ERROR}
    for status in S:
        assert (exit_codes.for_verdicts([status]) != 0) == (status in exit_codes.BAD), status


def test_several_runs_an_engine_that_could_not_run_wins_else_the_deciding_codes():
    assert exit_codes.combined([]) == 0
    assert exit_codes.combined([0, 1, 0]) == 1
    assert exit_codes.combined([1, 2, 0]) == 2
    assert exit_codes.combined([1, 1], deciding=[0]) == 0  # expectations met: the FAILs were expected
    assert exit_codes.combined([0, 2], deciding=[0]) == 2
    assert exit_codes.combined([0, 0], deciding=[1, 0]) == 1
    assert exit_codes.for_expectations([True, True]) == 0 and exit_codes.for_expectations([True, False]) == 1
