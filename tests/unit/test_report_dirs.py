"""``report`` and ``compare`` take what ``run`` printed (a run, a scenario, a run of several
builds, or a page inside one); every top page starts with its provenance (records only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import CompareError, UsageError
from harness.judge.evaluate import evaluate
from harness.orchestrate.directories import comparable_pairs, kind_of, rejudge
from harness.paths import PATHS
from harness.report import write_reports
from harness.report.matrix import matrix_summary, write_matrix
from harness.spec.scenario import CellGroup, ModelRef
from tests.helpers import cli
from tests.unit.run_dirs import write_run

GROUPS = ("tiny-qwen3-eager-tp1", "tiny-qwen3-eager-tp1-bf16")


def scenario_dir(root: Path) -> Path:
    """A finished one-build scenario of two cell groups, as ``run -s`` leaves it."""
    results = []
    for g in GROUPS:
        write_run(root / g, paths=("reload_weights",))
        ev = evaluate(root / g, PATHS.get)
        write_reports(ev, root / g)
        results.append((CellGroup(id=g, model=ModelRef(g, path="/a"), spec=ev.record.spec), ev))
    write_matrix(root, matrix_summary("default", results))
    return root


def test_report_rejudges_a_scenario_directory_and_its_index_page(tmp_path):
    root = scenario_dir(tmp_path / "default-run")
    assert kind_of(root) == "scenario"
    (root / GROUPS[0] / "index.html").unlink()
    code, index, errors = rejudge(root / "index.html", None, lambda m: None)  # the page make run printed
    assert index == root / "index.html" and errors == [] and code == 0
    assert (root / GROUPS[0] / "index.html").is_file()  # every group re-rendered
    assert set(json.loads((root / "summary.json").read_text())["grid"]) == set(GROUPS)


def test_report_out_writes_a_new_directory_and_leaves_the_run_as_it_was(tmp_path):
    root = scenario_dir(tmp_path / "run")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    proc = cli("report", str(root), "--out", str(tmp_path / "new"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "new" / "index.html").is_file() and (tmp_path / "new" / GROUPS[1] / "summary.md").is_file()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    again = cli("report", str(root), "--out", str(tmp_path / "new"))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_compare_pairs_two_scenario_directories_group_by_group(tmp_path):
    base, pr = scenario_dir(tmp_path / "base"), scenario_dir(tmp_path / "pr")
    pairs = comparable_pairs(base, pr / "index.html", None)
    assert [(g, b, p) for g, b, p, _ in pairs] == [(g, base / g, pr / g) for g in GROUPS]
    proc = cli("compare", str(base), str(pr), "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    assert all((tmp_path / "cmp" / g / "comparison.json").is_file() for g in GROUPS)
    assert (tmp_path / "cmp" / "index.html").is_file()
    with pytest.raises(UsageError, match="not a mix"):
        comparable_pairs(base, pr / GROUPS[0], None)
    with pytest.raises(UsageError, match="holds no run"):
        comparable_pairs(tmp_path, pr, None)


def test_compare_refuses_runs_of_different_models_or_dtypes_unless_allowed(tmp_path):
    import dataclasses

    from harness.judge.crossbuild import compare_builds

    write_run(tmp_path / "base")
    write_run(tmp_path / "pr")
    base, pr = evaluate(tmp_path / "base", PATHS.get), evaluate(tmp_path / "pr", PATHS.get)
    assert compare_builds(base, pr).builds  # one model, one dtype
    other_model = dataclasses.replace(
        pr, record=dataclasses.replace(pr.record, checkpoints=dataclasses.replace(pr.record.checkpoints, a="/other"))
    )
    engine = dataclasses.replace(pr.record.spec.engine, dtype="bfloat16")
    other_dtype = dataclasses.replace(
        pr, record=dataclasses.replace(pr.record, spec=dataclasses.replace(pr.record.spec, engine=engine))
    )
    for other in (other_model, other_dtype):
        with pytest.raises(CompareError, match="different models or dtypes"):
            compare_builds(base, other)
        assert any(
            "different models or dtypes" in n for n in compare_builds(base, other, allow_model_mismatch=True).notes
        )


def test_every_top_page_starts_with_its_provenance(tmp_path):
    root = scenario_dir(tmp_path / "run")
    first = ("vLLM", "torch", "device", "CPU as vLLM saw it", "harness commit", "date", "duration", "model")
    for md in (root / "summary.md", root / GROUPS[0] / "summary.md"):
        lines = md.read_text().splitlines()
        body = [ln for ln in lines[1:] if ln.strip()]
        assert [ln.split(":")[0] for ln in body[: len(first)]] == [f"- {k}" for k in first], md
        assert any(ln.startswith("- reload mode: layerwise") for ln in body), md  # records without one
        assert any(ln.startswith("- A and B: ") for ln in body) and any(ln.startswith("- dtype: ") for ln in body)
    for page in (root / "index.html", root / GROUPS[0] / "index.html"):
        html = page.read_text()
        assert html.index("id='provenance'") < html.index("<h2>"), page


def test_a_finding_named_by_a_known_issue_exists():
    from harness.spec import known_issues

    root = Path(__file__).resolve().parents[2]
    issues = [v for v in vars(known_issues).values() if isinstance(v, known_issues.KnownIssue)]
    issues += [
        k
        for v in vars(known_issues).values()
        if isinstance(v, tuple)
        for k in v
        if isinstance(k, known_issues.KnownIssue)
    ]
    issues += [k for name in PATHS.names() for k in PATHS.get(name).known_issues]
    named = {k.finding for k in issues if k.finding}
    assert named and all((root / f).is_file() for f in named), named


def test_rows_equal_but_for_their_path_collapse_into_one_naming_the_paths():
    from harness.report.html import _collapsed

    rows = [{"path": p, "tensor": "t", "status": "UNJUDGEABLE"} for p in ("a", "b", "c")]
    rows.append({"path": "a", "tensor": "u", "status": "NOISY"})
    rows.append({"path": "b", "tensor": "u", "status": "NOISY"})
    every, other = _collapsed(rows, ("tensor", "status"), ["a", "b", "c"])
    assert every["paths"] == ["a", "b", "c"] and every["paths_shown"] == "every path (3)"
    assert other["paths"] == ["a", "b"] and other["paths_shown"] == "2 paths"


def test_a_run_page_says_first_whether_outputs_moved(tmp_path):
    write_run(tmp_path / "run", paths=("reload_weights",))
    ev = evaluate(tmp_path / "run", PATHS.get)
    files = write_reports(ev, tmp_path / "run")
    html = files["index.html"].read_text()
    assert "id='outputs'" in html and "equal cold B" in html[html.index("id='outputs'") :][:200]
    assert html.index("id='outputs'") < html.index("id='positive-control'")
    assert "Outputs: greedy tokens and logprobs equal cold B" in files["summary.md"].read_text()


def test_a_scenario_whose_first_group_recorded_nothing_takes_its_software_from_the_next(tmp_path):
    """Every arm of the first cell group died before saying what it ran on (the fp16 int8
    families abort at their first request on AMX): the scenario's first lines still name the vLLM,
    torch and device its other groups recorded, not "not recorded"."""
    import dataclasses

    from harness import store
    from harness.records import ArmResult
    from harness.report.provenance import scenario_provenance

    evaluations = []
    for g, environment in zip(GROUPS, [(), (("vllm", "0.32.0"), ("torch", "2.13.0+cpu"), ("device", "cpu"))]):
        write_run(tmp_path / g, paths=("reload_weights",))
        for result_file in (tmp_path / g / "arms").glob("*.result.json"):
            result = store.load(ArmResult, result_file, "arm_result")
            store.dump(dataclasses.replace(result, environment=environment), result_file, "arm_result")
        evaluations.append(evaluate(tmp_path / g, PATHS.get))
    provenance = scenario_provenance(evaluations)
    assert provenance["vLLM"].startswith("0.32.0, commit "), provenance
    assert (provenance["torch"], provenance["device"]) == ("2.13.0+cpu", "cpu"), provenance
