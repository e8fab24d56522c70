"""Two builds side by side, from synthetic records: every outcome has a planted difference
it must report and a twin inside the floor it must call "no measurable difference"."""

from __future__ import annotations

import dataclasses

import pytest

from harness.errors import CompareError
from harness.judge.crossbuild import NO_DIFFERENCE, compare_builds, layer_of, parse_expectation
from harness.judge.diff import compare_path
from harness.judge.evaluation import Evaluation, RunRecord
from harness.judge.verdict import SabotageOutcome, VerdictStatus, judge, with_sabotage
from harness.plan import Plan
from harness.records import HookRecord
from harness.report.compare_page import render_html, render_markdown, write_comparison
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.run import JudgePolicy, RunSpec
from tests.records import EXPECTED, A, B, arm, obs, output, subject

# Each path's twin ran and was caught: a PASS here is earned.
CAUGHT = SabotageOutcome("left q_proj out", "tensor", "q_proj.weight", VerdictStatus.FAIL, True, "caught")
CKPT = CheckpointSet(a="/a", b="/b", b_control="/b2", control_tensor="q_proj.weight")
HOOKS = (
    HookRecord("model.layers.0.qkv_proj", "quant_method", 0, "UnquantizedLinearMethod"),
    HookRecord("model.layers.1.qkv_proj", "quant_method", 0, "UnquantizedLinearMethod"),
)


def evaluation(cold_b=B, subj=None, outputs=None, seconds=10.0, hooks=HOOKS, noise_b=None, vllm="0.31.0"):
    """One run: reference and noise arms on cold B, a subject on path ``p``, judged for real."""
    cold = dataclasses.replace(obs("cold_B", cold_b, outputs), hooks=hooks)
    noise_cold = dataclasses.replace(obs("cold_B", noise_b or cold_b, outputs), hooks=hooks)
    env = (("device", "cpu"), ("vllm", vllm), ("torch", "2.13.0+cpu"))
    ref = dataclasses.replace(arm("reference", "reference", cold), seconds=seconds, environment=env)
    noise = dataclasses.replace(arm("noise", "noise", noise_cold), seconds=seconds, environment=env)
    s = dataclasses.replace(subj or subject(), environment=env)
    c = compare_path("p", s, ref, noise, "q_proj.weight", 1e-4, EXPECTED)
    record = RunRecord(
        spec=RunSpec(model="/a", paths=("p",)),
        checkpoints=CKPT,
        plan=Plan(arms=(), skipped=()),
        git_sha="abc",
        started="2026-01-01T00:00:00Z",
    )
    return Evaluation(
        record=record,
        arms=(ref, noise, s),
        comparisons=(c,),
        verdicts=(with_sabotage(judge(c, JudgePolicy(), False), CAUGHT),),
    )


STALE = subject(warm_b={**B, "norm": A["norm"]}, warm_b_again={**B, "norm": A["norm"]})


def test_fixed_pr_meets_base_fail_pr_pass_and_names_the_fixed_tensor():
    cmp = compare_builds(
        evaluation(subj=STALE),
        evaluation(vllm="0.34.0+cpu"),
        expectations=(parse_expectation("base=FAIL"), parse_expectation("pr=PASS")),
    )
    # What a release check wants to read: the version that fixed it.
    assert [(r.base, r.pr, r.outcome) for r in cmp.verdicts] == [("FAIL", "PASS", "fixed in vLLM 0.34.0+cpu")]
    # ... and a PASS that stays a PASS, or a FAIL that stays, is no fix.
    assert [r.outcome for r in compare_builds(evaluation(), evaluation(vllm="0.34.0")).verdicts] == ["same"]
    assert [r.outcome for r in compare_builds(evaluation(subj=STALE), evaluation(subj=STALE)).verdicts] == ["same"]
    # On one vLLM, the fix is the PR's, not a release's.
    assert [r.outcome for r in compare_builds(evaluation(subj=STALE), evaluation()).verdicts] == ["fixed"]
    assert cmp.exit_code == 0 and all(e.met for e in cmp.expectations)
    deciding = [c for c in cmp.status_changes if c.decides]
    assert {(c.tensor, c.base, c.pr) for c in deciding} >= {("norm", "STALE", "OK")}


def test_unmet_expectation_fails_the_comparison():
    cmp = compare_builds(evaluation(), evaluation(), expectations=(parse_expectation("base=FAIL"),))
    assert cmp.exit_code == 1 and not cmp.expectations[0].met


def test_without_expectations_a_regression_fails_and_a_fix_does_not():
    assert compare_builds(evaluation(), evaluation(subj=STALE)).exit_code == 1
    assert compare_builds(evaluation(subj=STALE), evaluation()).exit_code == 0


def test_value_difference_is_reported_only_beyond_the_floor():
    pr_b = {**B, "w": "other"}
    cmp = compare_builds(evaluation(), evaluation(cold_b=pr_b), evaluation())
    assert [(v.tensor, v.outcome) for v in cmp.values] == [("w", "differs")]
    # The same difference when base2 differs too: inside the floor.
    cmp = compare_builds(evaluation(), evaluation(cold_b=pr_b), evaluation(cold_b={**B, "w": "third"}))
    assert [(v.tensor, v.outcome) for v in cmp.values] == [("w", NO_DIFFERENCE)]
    # ... or when two cold starts inside base already disagree on it.
    cmp = compare_builds(evaluation(noise_b={**B, "w": "jitter"}), evaluation(cold_b=pr_b))
    assert [(v.tensor, v.outcome) for v in cmp.values] == [("w", NO_DIFFERENCE)]


def test_token_divergence_against_the_base2_floor():
    same = [output(0, (1, 2, 3, 4))]
    moved = [output(0, (1, 2, 9, 9))]
    cmp = compare_builds(evaluation(outputs=same), evaluation(outputs=moved), evaluation(outputs=same))
    assert [(t.first_divergence, t.outcome) for t in cmp.tokens] == [(2, "differs")]
    cmp = compare_builds(evaluation(outputs=same), evaluation(outputs=same), evaluation(outputs=same))
    assert [t.outcome for t in cmp.tokens] == ["identical"]
    cmp = compare_builds(
        evaluation(outputs=same), evaluation(outputs=moved), evaluation(outputs=[output(0, (1, 7, 7, 7))])
    )
    assert [t.outcome for t in cmp.tokens] == [NO_DIFFERENCE]  # base2 already diverges earlier


def test_timing_inside_the_base2_band_is_no_measurable_difference():
    cmp = compare_builds(evaluation(seconds=10), evaluation(seconds=11), evaluation(seconds=12))
    assert {r.arm: r.outcome for r in cmp.timings}["reference"] == NO_DIFFERENCE
    cmp = compare_builds(evaluation(seconds=10), evaluation(seconds=20), evaluation(seconds=10.5))
    assert {r.arm: r.outcome for r in cmp.timings}["reference"] == "slower"


def test_hook_census_by_class():
    extra = HOOKS + (HookRecord("model.layers.0.attn", "module", 0, "Attention"),)
    cmp = compare_builds(evaluation(), evaluation(hooks=extra))
    rows = {(h.owner, h.kind): h for h in cmp.hooks}
    assert rows[("Attention", "module")].outcome == "changed" and rows[("Attention", "module")].pr == 1
    assert rows[("UnquantizedLinearMethod", "quant_method")].base == 2
    assert rows[("UnquantizedLinearMethod", "quant_method")].outcome == "same"


def test_expectation_syntax():
    e = parse_expectation("pr:reload_*=pass")
    assert (e.build, e.cells, e.verdict) == ("pr", "reload_*", "PASS")
    with pytest.raises(CompareError):
        parse_expectation("pr=GOOD")


def test_layer_names():
    assert layer_of("model.layers.12.mlp.down_proj.weight") == "layer 12"
    assert layer_of("model.embed_tokens.weight") == "embed"
    assert layer_of("lm_head.<kernel-output>") == "head"


def test_report_files_are_self_contained_and_escaped(tmp_path):
    hostile = {**B, "<script>alert(1)</script>": "x"}
    cmp = compare_builds(
        evaluation(subj=STALE), evaluation(cold_b=hostile), evaluation(), expectations=(parse_expectation("base=FAIL"),)
    )
    files = write_comparison(cmp, tmp_path)
    html = files["index.html"].read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "http://" not in html and "https://" not in html  # no CDN, nothing fetched
    for anchor in ('id="grid"', 'id="plot-layers"', 'id="plot-divergence"', 'id="plot-timings"', 'id="provenance"'):
        assert anchor in html
    assert html.index('id="grid"') < html.index('id="deciding"') < html.index('id="values"')
    md = render_markdown(cmp)
    assert "| `p` | ❌ FAIL |" in md and "Expectations: met" in md
    assert files["verdicts.csv"].read_text().splitlines()[0].startswith("schema_version,path,base,pr,base2,outcome")
    assert render_html(cmp) == html


def with_throughput(ev, cold, refit):
    """Put throughput samples on a synthetic run: ``cold`` on both cold engines, ``refit`` on the subject."""
    from harness.records import Measurement
    from tests.records import probe

    def m(point, xs):
        return (Measurement(label=probe("throughput", point), batch=8, output_len=32, tokens_per_s=tuple(xs)),)

    arms = tuple(
        dataclasses.replace(a, measurements=m("cold_B", cold) if a.role != "subject" else m("p", refit))
        for a in ev.arms
    )
    return dataclasses.replace(ev, arms=arms)


def test_throughput_inside_the_base_base2_band_is_no_measurable_difference():
    base = with_throughput(evaluation(), [100, 104, 102], [101, 103, 99])
    base2 = with_throughput(evaluation(), [98, 101, 99], [100, 97, 102])
    rows = {
        r.point: r
        for r in compare_builds(base, with_throughput(evaluation(), [99, 100, 101], [100, 101, 99]), base2).throughput
    }
    assert rows["cold_B"].outcome == NO_DIFFERENCE and rows["p"].outcome == NO_DIFFERENCE
    rows = {
        r.point: r
        for r in compare_builds(base, with_throughput(evaluation(), [60, 61, 59], [100, 101, 99]), base2).throughput
    }
    assert rows["cold_B"].outcome == "slower" and rows["p"].outcome == NO_DIFFERENCE


def test_a_refit_engine_slower_than_its_own_cold_b_is_flagged():
    from harness.judge.throughput import points

    slow = with_throughput(evaluation(), [100, 104, 102], [80, 82, 81])
    assert {p.point: p.slower_than_cold for p in points(slow.arms)} == {"cold_B": False, "p": True}
    same = with_throughput(evaluation(), [100, 104, 102], [99, 103, 101])  # median 101 >= min cold 100
    assert not any(p.slower_than_cold for p in points(same.arms))
    rows = compare_builds(same, slow).throughput
    assert {r.point: r.slower_than_cold for r in rows}["p"] == "pr"


def test_run_report_puts_deciding_rows_first_and_folds_noisy_ones(tmp_path):
    from harness.report import write_reports

    # "w" differs between the two cold engines (NOISY, not judged); "norm" stays stale (decides).
    ev = evaluation(subj=STALE, noise_b={**B, "w": "jitter"})
    html = write_reports(ev, tmp_path)["index.html"].read_text()
    section = html[html.index("id='tensors'") : html.index("id='consumed'")]
    folded = section.index("<details>")
    assert section.index("<code>norm</code>") < folded < section.index("<code>w</code>")
    assert "NOISY" in section[folded:] and "STALE" in section[:folded]


def test_layer_plot_leaves_out_tensors_two_cold_starts_disagree_on():
    from tests.records import tensor as rec

    def recs(w_absmax):
        return [
            dataclasses.replace(rec("model.layers.0.w", f"w{w_absmax}"), absmax=w_absmax),
            dataclasses.replace(rec("model.layers.1.h", "h"), absmax=1.0),
        ]

    noisy_base = evaluation(cold_b=recs(1.0), noise_b=recs(1.5))
    assert dict(
        (layer, c) for layer, c, _ in compare_builds(noisy_base, evaluation(cold_b=recs(2.0))).layer_change
    ) == {
        "layer 0": 0.0,
        "layer 1": 0.0,
    }
    assert dict(
        (layer, c)
        for layer, c, _ in compare_builds(evaluation(cold_b=recs(1.0)), evaluation(cold_b=recs(2.0))).layer_change
    ) == {"layer 0": 1.0, "layer 1": 0.0}


def test_speed_beyond_the_band_on_a_loaded_machine_is_not_a_gain_or_loss():
    def loaded(ev, load):
        extra = (("load_average", str(load)), ("cpus", "2"))
        arms = tuple(dataclasses.replace(a, environment=a.environment + extra) for a in ev.arms)
        return dataclasses.replace(ev, arms=arms)

    quiet = compare_builds(
        loaded(evaluation(seconds=10), 0.5), loaded(evaluation(seconds=20), 0.5), loaded(evaluation(seconds=10.5), 0.5)
    )
    assert {r.arm: r.outcome for r in quiet.timings}["reference"] == "slower"
    busy = compare_builds(
        loaded(evaluation(seconds=10), 9.0), loaded(evaluation(seconds=20), 0.5), loaded(evaluation(seconds=10.5), 0.5)
    )
    assert {r.arm: r.outcome for r in busy.timings}["reference"] == "not comparable (machine loaded)"
    assert any("machine was loaded" in n for n in busy.notes)
