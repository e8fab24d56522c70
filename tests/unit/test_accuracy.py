"""The accuracy probe from synthetic records: the file is checked before any engine starts,
the judge flags a refit that changes accuracy only when the eval can discriminate, and says
"no discriminating power" (never a pass) when a damaged B scores like B."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.errors import AccuracyFileError
from harness.judge.accuracy import DIFFERS, NO_POWER, SAME, extract_answer, judge_accuracy, read_accuracy_file
from harness.judge.crossbuild import NO_DIFFERENCE, compare_builds
from harness.records import ArmResult, Completions
from harness.spec.run import AccuracySpec
from tests.helpers import cli
from tests.records import probe
from tests.unit.test_crossbuild import evaluation

ANSWERS = ("5", "7", "9", "11")


def texts(right: int, invalid: int = 0) -> tuple[str, ...]:
    """Completions of the four items: the first ``right`` correct, then ``invalid`` empty answers, then wrong."""
    out = [f" {a}\nQuestion: more" for a in ANSWERS[:right]]
    out += ["\n 5"] * invalid  # nothing before the first newline: no answer given
    out += ["x"] * (len(ANSWERS) - len(out))
    return tuple(out)


def arm(name: str, role: str, point: str, completions: tuple[str, ...]) -> ArmResult:
    return ArmResult(
        arm=name,
        role=role,
        paths=("p",) if role == "subject" else (),
        status="ok",
        error=None,
        observations=(),
        seconds=1.0,
        completions=(Completions(label=probe("accuracy", point), tokenizer="test", texts=completions),),
    )


def arms(cold=4, noise=None, damaged=0, warm=4):
    return (
        arm("reference", "reference", "cold_B", texts(cold)),
        arm("noise", "noise", "cold_B", texts(cold if noise is None else noise)),
        arm("damaged", "damaged", "cold_B_damaged", texts(damaged)),
        arm("subject-p", "subject", "p", texts(warm)),
    )


# --- the file ------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [("question", "answer"), ("input", "target"), ("prompt", "answer")])
def test_lm_eval_style_field_names_are_read(tmp_path, fields):
    q, a = fields
    f = tmp_path / "items.jsonl"
    f.write_text(json.dumps({q: "2+3=", a: 5, "id": 1}) + "\n\n" + json.dumps({q: "1+1=", a: " 2 "}) + "\n")
    spec = read_accuracy_file(f)
    assert spec.prompts == ("2+3=", "1+1=") and spec.answers == ("5", " 2 ") and spec.file == str(f)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no items"),
        ("\n  \n", "no items"),
        ('{"question": "q"}\n', "line 1: needs a prompt and its answer"),
        ('{"question": "q", "answer": "a"}\nnot json\n', "line 2: not JSON"),
        ('["q", "a"]\n', "a JSON object is expected"),
        ('{"question": "  ", "answer": "a"}\n', "'question' must be a non-empty string"),
        ('{"input": "q", "target": ""}\n', "'target' must be a non-empty string or number"),
        ('{"input": "q", "target": ["a"]}\n', "'target' must be a non-empty string or number"),
    ],
)
def test_bad_files_are_refused_naming_the_line(tmp_path, content, message):
    f = tmp_path / "items.jsonl"
    f.write_text(content)
    with pytest.raises(AccuracyFileError, match=message):
        read_accuracy_file(f)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read it"),
        ("", "no items"),
        ('{"question": "what?"}\n', "needs a prompt and its answer"),
    ],
)
def test_bad_accuracy_file_is_one_line_and_exit_2_before_any_engine(tmp_path, content, message):
    f = tmp_path / "items.jsonl"
    if content is not None:
        f.write_text(content)
    proc = cli("run", "--accuracy", str(f), "--executor", "local", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert len(errors) == 1 and message in errors[0] and "--accuracy" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o" / "arms").exists()


def test_a_model_without_a_tokenizer_and_too_small_a_vocabulary_is_refused(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 50}')
    items = tmp_path / "items.jsonl"
    items.write_text('{"question": "1+1=", "answer": "2"}\n')
    proc = cli(
        "run", "--model", str(model), "--accuracy", str(items), "--executor", "local", "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 2, proc.stderr
    assert "--accuracy needs a tokenizer" in proc.stderr and "Traceback" not in proc.stderr
    (model / "tokenizer.json").write_text("{}")  # its own tokenizer: the check passes (then B cannot be made)
    proc = cli(
        "run", "--model", str(model), "--accuracy", str(items), "--executor", "local", "--out", str(tmp_path / "o2")
    )
    assert proc.returncode == 2 and "needs a tokenizer" not in proc.stderr, proc.stderr


# --- the judge -----------------------------------------------------------------------------


def test_answers_are_the_first_line_and_an_empty_one_is_invalid():
    assert extract_answer(" 42 \nQuestion: 1+1") == "42"
    assert extract_answer("\n42") == ""
    j = judge_accuracy(arms(cold=3), ANSWERS)
    ref = next(p for p in j.points if p.arm == "reference")
    assert (ref.correct, ref.invalid, ref.total) == (3, 0, 4)
    j = judge_accuracy((arm("reference", "reference", "cold_B", texts(1, invalid=2)),), ANSWERS)
    assert (j.points[0].correct, j.points[0].invalid, j.points[0].invalid_rate) == (1, 2, 0.5)


def test_with_discriminating_power_a_refit_that_changes_accuracy_is_flagged():
    j = judge_accuracy(arms(cold=4, damaged=1, warm=2), ANSWERS)
    assert j.discriminates and j.cold_range == (4, 4)
    path = next(p for p in j.points if p.point == "p")
    assert path.status == DIFFERS and path.flagged and j.summary == f"{DIFFERS}: p"


def test_with_discriminating_power_equal_accuracy_is_not_flagged():
    j = judge_accuracy(arms(cold=4, damaged=1, warm=4), ANSWERS)
    assert j.discriminates and j.summary == SAME
    assert not any(p.flagged for p in j.points) and next(p for p in j.points if p.point == "p").status == SAME


def test_inside_the_cold_b_floor_is_the_same():
    """Reference 3, noise 4: a refit scoring 3 or 4 is the same as cold B, 2 is not."""
    assert judge_accuracy(arms(cold=3, noise=4, damaged=0, warm=3), ANSWERS).summary == SAME
    assert judge_accuracy(arms(cold=3, noise=4, damaged=0, warm=2), ANSWERS).summary == f"{DIFFERS}: p"


@pytest.mark.parametrize("cold, damaged, warm", [(0, 0, 0), (0, 0, 2), (3, 3, 3), (2, 4, 2)])
def test_a_damaged_arm_scoring_no_lower_means_no_discriminating_power_and_no_pass(cold, damaged, warm):
    j = judge_accuracy(arms(cold=cold, damaged=damaged, warm=warm), ANSWERS)
    assert not j.discriminates and j.summary == NO_POWER
    path = next(p for p in j.points if p.point == "p")
    assert path.status == NO_POWER and not path.flagged


def test_without_a_damaged_arm_there_is_no_discriminating_power():
    assert not judge_accuracy(arms()[:2] + arms()[3:], ANSWERS).discriminates


# --- plan and cache key --------------------------------------------------------------------

SPEC = AccuracySpec(file="f.jsonl", prompts=("2+3=", "1+1="), answers=("5", "2"), max_tokens=8)


def test_plan_measures_cold_b_after_the_first_refit_and_on_a_damaged_b():
    from harness.plan import Observe, PathNeeds, Probe, make_plan
    from harness.records import ObservationLabel
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import RunSpec, ThroughputSpec

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="t", b_damaged="/d")
    needs = {p: PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")) for p in ("x", "y")}
    plain = make_plan(RunSpec(model="/a", paths=("x", "y")), cs, needs, {})
    assert [a.role for a in plain.arms] == ["reference", "noise", "subject"]
    assert not any(isinstance(s, Probe) for a in plain.arms for s in a.steps)
    plan = make_plan(RunSpec(model="/a", paths=("x", "y"), accuracy=SPEC, throughput=ThroughputSpec()), cs, needs, {})
    ref, noise, subject, damaged = plan.arms
    warm_b = ObservationLabel("warm_B", "x")
    assert ref.steps[-1] == Probe(probe("accuracy", "cold_B")) and noise.steps == ref.steps
    at = subject.steps.index(Probe(probe("accuracy", "x")))
    assert subject.steps[at - 2 : at] == (Observe(warm_b), Probe(probe("throughput", "x")))
    assert sum(isinstance(s, Probe) and s.label.probe == "accuracy" for s in subject.steps) == 1
    assert (damaged.role, damaged.start, damaged.steps) == (
        "damaged",
        "B_damaged",
        (Probe(probe("accuracy", "cold_B_damaged")),),
    )
    assert damaged.cold_label == ObservationLabel("cold_B_damaged") and cs.directory(damaged.start) == "/d"
    assert ref.accuracy.prompts == SPEC.prompts and not hasattr(ref.accuracy, "answers")  # arms never see answers


def test_reference_key_covers_the_accuracy_prompts_not_the_answers(tmp_path, monkeypatch):
    from tests.unit.test_reference import checkpoint, key

    b = checkpoint(tmp_path / "B")
    plain = key(b)
    with_acc = key(b, accuracy=SPEC)
    assert with_acc != plain
    assert key(b, accuracy=dataclasses.replace(SPEC, prompts=("2+3=", "1+2="))) != with_acc
    assert key(b, accuracy=dataclasses.replace(SPEC, max_tokens=9)) != with_acc
    # Answers are judged from records: another answer key re-judges the same completions.
    assert key(b, accuracy=dataclasses.replace(SPEC, answers=("6", "2"), file="g.jsonl")) == with_acc


# --- the character-level tokenizer ---------------------------------------------------------


def test_char_tokenizer_round_trips_and_fits_the_tiny_vocabulary():
    from harness.checkpoints.tiny import TINY_QWEN3
    from harness.tokenizer import CHAR_VOCAB, char_tokenizer

    tok = char_tokenizer()
    text = "What is 2 + 3?\nAnswer: 5"
    ids = tok.encode(text).ids
    assert len(ids) == len(text) and max(ids) < CHAR_VOCAB <= TINY_QWEN3["vocab_size"]
    assert tok.decode(ids) == text
    assert tok.decode([300, ids[0], 0, 511]) == "W"  # ids it does not know decode to nothing
    assert char_tokenizer().to_str() == tok.to_str()  # deterministic


# --- reports and builds --------------------------------------------------------------------


def with_accuracy(
    ev, cold=4, noise=None, damaged=0, warm=4, spec=dataclasses.replace(SPEC, prompts=("a",) * 4, answers=ANSWERS)
):
    made = arms(cold, noise, damaged, warm)
    by_role = {a.role: a for a in made}
    runs = tuple(dataclasses.replace(a, completions=by_role[a.role].completions) for a in ev.arms) + (
        by_role["damaged"],
    )
    record = dataclasses.replace(ev.record, spec=dataclasses.replace(ev.record.spec, accuracy=spec))
    return dataclasses.replace(ev, arms=runs, record=record)


def test_run_report_shows_accuracy_and_never_a_pass_without_discriminating_power(tmp_path):
    from harness.report import write_reports

    files = write_reports(with_accuracy(evaluation(), cold=0, damaged=0, warm=0), tmp_path / "r")
    summary = json.loads(files["summary.json"].read_text())["accuracy"]
    assert summary["discriminating_power"] is False and summary["outcome"] == NO_POWER
    md = files["summary.md"].read_text()
    assert "**no discriminating power**" in md and SAME not in md
    assert "No discriminating power" in files["index.html"].read_text()
    csv = files["accuracy.csv"].read_text().splitlines()
    assert csv[0] == "schema_version,point,arm,item,prompt,answer,completion,given,correct,invalid"
    assert len(csv) == 1 + 4 * 4  # four items at four points

    files = write_reports(with_accuracy(evaluation(), cold=4, damaged=1, warm=2), tmp_path / "s")
    summary = json.loads(files["summary.json"].read_text())["accuracy"]
    assert summary["discriminating_power"] is True and summary["outcome"] == f"{DIFFERS}: p"
    assert "**differs from cold B**" in files["summary.md"].read_text()


def test_crossbuild_accuracy_delta_inside_the_floor_is_no_measurable_difference():
    base = with_accuracy(evaluation(), cold=3, noise=4, damaged=0, warm=3)
    base2 = with_accuracy(evaluation(), cold=4, damaged=0, warm=4)
    same = compare_builds(base, with_accuracy(evaluation(), cold=4, damaged=0, warm=4), base2)
    rows = {r.point: r for r in same.accuracy}
    assert rows["cold_B"].outcome == NO_DIFFERENCE and rows["p"].outcome == NO_DIFFERENCE
    assert rows["p"].delta == pytest.approx(0.25) and not rows["p"].differs_from_cold
    lower = {
        r.point: r for r in compare_builds(base, with_accuracy(evaluation(), cold=2, damaged=0, warm=1), base2).accuracy
    }
    assert lower["cold_B"].outcome == "lower" and lower["p"].outcome == "lower"
    assert lower["p"].differs_from_cold == "pr"  # pr's refit scored 1, its own cold B 2


def test_crossbuild_accuracy_without_discriminating_power_says_so():
    from harness.report.compare_page import render_html, render_markdown

    base = with_accuracy(evaluation(), cold=0, damaged=0, warm=0)
    cmp = compare_builds(base, with_accuracy(evaluation(), cold=2, damaged=2, warm=1), base)
    assert {r.outcome for r in cmp.accuracy} == {NO_POWER}
    assert f"— {NO_POWER}" in render_markdown(cmp) and 'id="t-accuracy"' in render_html(cmp)
    other = with_accuracy(evaluation(), spec=dataclasses.replace(SPEC, prompts=("b",) * 4, answers=ANSWERS))
    cmp = compare_builds(base, other)
    assert cmp.accuracy == () and any("different --accuracy items" in n for n in cmp.notes)
