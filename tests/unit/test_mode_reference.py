"""A subject whose engine mode is not the run's (the compiled path in an eager run) is judged
against a cold B in its own mode; the noise floor stays the run's reference/noise pair.

Measured on the zoo in bf16: compiled warm B vs eager cold B differ by 0.004-0.008 in
logprobs and diverge in tokens, with every tensor equal and the compiled round trip exact.
"""

from __future__ import annotations

import dataclasses

from harness.judge.diff import compare_path
from harness.plan import Observe, PathNeeds, make_plan, mode_reference_name
from harness.records import ObservationLabel
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.requirements import EngineRequirements
from harness.spec.run import EngineSpec, RunSpec
from tests.records import EXPECTED, B, arm, obs, output, subject

CS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
TARGETS = ("B", "B", "B_control", "A")


def test_a_compiled_path_in_an_eager_run_gets_a_compiled_cold_b():
    needs = {
        "eager_path": PathNeeds(EngineRequirements(), TARGETS),
        "compiled": PathNeeds(EngineRequirements(mode="compiled"), TARGETS),
    }
    plan = make_plan(RunSpec(model="/a", paths=("eager_path", "compiled")), CS, needs, {})
    by_name = {a.name: a for a in plan.arms}
    own = by_name[mode_reference_name("compiled")]
    assert (own.role, own.start, own.steps, own.requirements.mode) == (
        "mode_reference",
        "B",
        (Observe(ObservationLabel("cold_B")),),
        "compiled",
    )
    assert [a.role for a in plan.arms].count("mode_reference") == 1
    # None when every subject runs in the run's mode, or the run itself is compiled.
    only_eager = make_plan(RunSpec(model="/a", paths=("eager_path",)), CS, needs, {})
    compiled_run = make_plan(
        RunSpec(model="/a", paths=("eager_path", "compiled"), engine=EngineSpec(mode="compiled")), CS, needs, {}
    )
    assert "mode_reference" not in [a.role for a in only_eager.arms + compiled_run.arms]


def _eager_cold_b_rounding_differently():
    return arm("reference", "reference", obs("cold_B", B, [output(0, (1, 2, 3), -1.004)]))


def test_the_refit_is_judged_against_the_subjects_own_mode():
    subj = subject()  # a perfect refit: warm B equals a cold B of its own mode
    eager_ref, noise = _eager_cold_b_rounding_differently(), _eager_cold_b_rounding_differently()
    compiled_ref = arm("reference-compiled", "mode_reference", obs("cold_B", B))
    # Against the eager cold B the logprobs differ (the false FAIL the zoo showed in bf16) ...
    against_eager = compare_path("p", subj, eager_ref, noise, "norm", 1e-4, EXPECTED, same_mode=False)
    assert max(t.max_logprob_diff for t in against_eager.tokens if t.check == "refit") > 1e-3
    # ... against its own mode they do not, and the noise floor is still the eager pair's.
    own = compare_path(
        "p", subj, eager_ref, noise, "norm", 1e-4, EXPECTED, same_mode=False, refit_reference=compiled_ref
    )
    assert max(t.max_logprob_diff for t in own.tokens if t.check == "refit") == 0.0
    assert [t.max_logprob_diff for t in own.tokens if t.check == "noise"] == [0.0]


def test_a_stale_refit_still_fails_against_its_own_mode():
    stale = subject(warm_b={**B, "norm": "a-n"})  # the norm kept A's value
    compiled_ref = arm("reference-compiled", "mode_reference", obs("cold_B", B))
    c = compare_path(
        "p",
        stale,
        _eager_cold_b_rounding_differently(),
        _eager_cold_b_rounding_differently(),
        "norm",
        1e-4,
        EXPECTED,
        same_mode=False,
        refit_reference=compiled_ref,
    )
    assert [d.status.value for d in c.tensors if d.check == "refit" and d.tensor == "norm"] == ["STALE"]


def test_a_mode_reference_that_failed_is_an_error_of_the_path():
    failed = dataclasses.replace(arm("reference-compiled", "mode_reference"), status="error", error="boom")
    c = compare_path(
        "p",
        subject(),
        _eager_cold_b_rounding_differently(),
        _eager_cold_b_rounding_differently(),
        "norm",
        1e-4,
        EXPECTED,
        same_mode=False,
        refit_reference=failed,
    )
    assert any("reference-compiled: boom" in e for e in c.errors)
