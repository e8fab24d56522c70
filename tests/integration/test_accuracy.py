"""The accuracy probe on real engines (the embedded tiny model, ``reload_weights``).

One run, four engines at most (cold B twice, the subject, the damaged B; fewer when the
reference comes from the cache):
- arithmetic questions: a tiny random model answers none, damaged or not, so the report
  must say the eval has no discriminating power, and must not call the refit's accuracy a pass;
- the same prompts with the model's own cold-B answers as the known answers: now the damaged
  copy of B scores lower (the eval discriminates) and the refit scores like cold B (no flag).

The second file needs no engine: arms are given the prompts, never the answers (the plan
holds ``AccuracyPrompts``), so the first run's completions are exactly what a second run
would produce. It is judged from the first run's records with the new answers.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from harness import store
from harness.judge.accuracy import NO_POWER, SAME, extract_answer, read_accuracy_file
from harness.judge.evaluate import evaluate
from harness.judge.evaluation import RunRecord
from harness.paths import PATHS
from harness.report import write_reports
from harness.spec.run import AccuracyPrompts
from tests.helpers import run_cli

pytestmark = [pytest.mark.cpu]

ARITHMETIC = [{"question": f"What is {a} + {b}?\nAnswer:", "answer": str(a + b)} for a in range(2, 8) for b in (3, 5)]


@pytest.fixture(scope="module")
def arithmetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("accuracy")
    items = root / "arithmetic.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in ARITHMETIC))
    run = run_cli(["run", "--paths", "reload_weights", "--accuracy", str(items)], root / "run", timeout=1500)
    assert run.exit_code == 0, run.output[-3000:]
    return run


def points(summary: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in summary["accuracy"]["points"]:
        out.setdefault(p["point"], []).append(p)
    return out


def test_arithmetic_on_a_tiny_random_model_has_no_discriminating_power(arithmetic):
    acc = arithmetic.summary["accuracy"]
    assert acc["items"] == len(ARITHMETIC) and acc["tokenizer"] == ["harness character-level (97 ids)"]
    by = points(arithmetic.summary)
    assert [p["arm"] for p in by["cold_B"]] == ["reference", "noise"]
    assert [p["correct"] for p in by["cold_B"] + by["cold_B_damaged"]] == [0, 0, 0]
    assert acc["discriminating_power"] is False and acc["outcome"] == NO_POWER
    assert by["reload_weights"][0]["status"] == NO_POWER
    md = (arithmetic.out / "summary.md").read_text()
    assert "**no discriminating power**" in md and SAME not in md
    assert "No discriminating power" in (arithmetic.out / "index.html").read_text()
    table = arithmetic.csv("accuracy.csv")
    assert len(table) == 4 * len(ARITHMETIC) and not table["correct"].any()


def test_the_models_own_answers_discriminate_and_the_refit_scores_like_cold_b(arithmetic, tmp_path):
    texts = json.loads((arithmetic.out / "arms" / "reference.result.json").read_text())["data"]["completions"][0][
        "texts"
    ]
    # The model's own cold-B answer where it gives one; the arithmetic answer (which it never gives) elsewhere.
    own = [extract_answer(t) or item["answer"] for t, item in zip(texts, ARITHMETIC)]
    assert sum(bool(extract_answer(t)) for t in texts) >= 3, texts
    items = tmp_path / "own.jsonl"
    items.write_text(
        "".join(json.dumps({"question": i["question"], "answer": a}) + "\n" for i, a in zip(ARITHMETIC, own))
    )
    spec = read_accuracy_file(items)

    # Same prompts and length: every arm would be planned exactly as it ran, so its records stand.
    record = store.load(RunRecord, arithmetic.out / "run.json", "run_record")
    assert all(a.accuracy == AccuracyPrompts(spec.prompts, spec.max_tokens) for a in record.plan.arms)
    rejudged = tmp_path / "rejudged"
    shutil.copytree(arithmetic.out, rejudged)
    store.dump(
        dataclasses.replace(record, spec=dataclasses.replace(record.spec, accuracy=spec)),
        rejudged / "run.json",
        "run_record",
    )
    files = write_reports(evaluate(rejudged, PATHS.get), rejudged)
    summary = json.loads(files["summary.json"].read_text())
    acc, by = summary["accuracy"], points(summary)
    cold_correct = [p["correct"] for p in by["cold_B"]]
    assert cold_correct == [sum(bool(extract_answer(t)) for t in texts)] * 2
    assert acc["discriminating_power"] is True and by["cold_B_damaged"][0]["correct"] < min(cold_correct)
    assert by["reload_weights"][0]["correct"] == cold_correct[0] and by["reload_weights"][0]["status"] == SAME
    assert acc["outcome"] == SAME and "differs from cold B" not in files["summary.md"].read_text()
