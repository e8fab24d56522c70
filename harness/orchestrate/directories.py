"""What a user hands ``report`` and ``compare``: whatever ``run`` printed. Three kinds of
directory, told apart by the file at their top:

- a **run** (``run.json``): one cell group, one build;
- a **scenario** (``summary.json`` with a ``scenario``): ``make run``, ``run -s``; its cell
  groups are runs in ``DIR/GROUP`` (one build) or ``DIR/BUILD/GROUP`` (several builds, with
  their comparisons in ``DIR/compare/GROUP``);
- **builds** (``comparison.json``): ``run --build base=... --build pr=...``, its runs in
  ``DIR/NAME``.

The path of a page inside one (``.../index.html``) stands for its directory. Re-judging and
comparing work from the records alone, as everywhere after observation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from harness.errors import UsageError
from harness.orchestrate.execute import Progress
from harness.run_dir import COMPARISON, INDEX_HTML, RUN_RECORD, SUMMARY_JSON, RunDir

Kind = Literal["run", "scenario", "builds"]


def directory_of(given: str | Path) -> Path:
    """The directory a user meant: the path itself, or the directory of a page in it."""
    path = Path(given)
    if path.is_file() and path.suffix in (".html", ".md", ".json"):
        path = path.parent
    if not path.is_dir():
        raise UsageError(f"{given}: no such directory")
    return path


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not readable ({exc})") from None


def kind_of(directory: Path) -> Kind:
    d = RunDir(directory)
    if d.is_run():
        return "run"
    if d.summary_json.is_file() and "scenario" in _json(d.summary_json):
        return "scenario"
    if d.comparison.is_file():
        return "builds"
    raise UsageError(
        f"{directory} holds no run ({RUN_RECORD}), scenario ({SUMMARY_JSON}) or comparison of builds ({COMPARISON}): "
        "give the directory 'refit-harness run' printed"
    )


def scenario_runs(directory: Path) -> dict[str, dict[str, Path]]:
    """A scenario directory's runs: build name ('' for one build) -> group id -> run directory
    (groups that never started are left out)."""
    summary = _json(RunDir(directory).summary_json)
    out: dict[str, dict[str, Path]] = {}
    for build in summary.get("builds") or [""]:
        for group in summary.get("groups", {}):
            run = directory / build / group if build else directory / group
            if RunDir(run).is_run():
                out.setdefault(build, {})[group] = run
    return out


def builds_runs(directory: Path) -> dict[str, Path]:
    """A builds directory's runs, by the name each build ran under (``base``, ``base2``, ``pr``)."""
    return {d.name: d for d in sorted(directory.iterdir()) if RunDir(d).is_run()}


def stored_expectations(comparison: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """The explicit expectations a stored comparison was judged with (``base:GLOB=VERDICT``), and
    its role -> run directory (``base``, ``pr``, ``base2``)."""
    data = _json(comparison)
    expect = tuple(
        f"{e['expectation']['build']}:{e['expectation']['cells']}={e['expectation']['verdict']}"
        for e in data.get("expectations", ())
        if not e.get("implied")
    )
    return expect, {b["label"]: b["directory"] for b in data.get("builds", ())}


# --- report DIR --------------------------------------------------------------------------------


def rejudge(given: str | Path, out: Path | None, progress: Progress) -> tuple[int, Path, list[str]]:
    """Re-judge and re-render whatever ``given`` is, into ``out`` (default: in place); the exit
    code, the top page and the cells that were an ERROR."""
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS
    from harness.report import write_reports

    source = directory_of(given)
    kind = kind_of(source)
    target = out or source
    if kind == "run":
        ev = evaluate(source, PATHS.get)
        files = write_reports(ev, target)
        return ev.exit_code, files[INDEX_HTML], [v.path for v in ev.verdicts if v.status.value == "ERROR"]
    if kind == "builds":
        return _rejudge_builds(source, target, progress)
    return _rejudge_scenario(source, target, progress)


def _rejudge_builds(source: Path, target: Path, progress: Progress) -> tuple[int, Path, list[str]]:
    from harness.judge import exit_codes
    from harness.judge.evaluate import evaluate
    from harness.orchestrate.matrix import compare_runs
    from harness.paths import PATHS
    from harness.report import write_reports

    runs = builds_runs(source)
    codes, errors = [], []
    for name, run in runs.items():
        ev = evaluate(run, PATHS.get)
        write_reports(ev, target / name)
        codes.append(ev.exit_code)
        errors += [f"[{name}] {v.path}" for v in ev.verdicts if v.status.value == "ERROR"]
        progress(f"[{name}] re-judged: " + ", ".join(f"{v.path} {v.shown}" for v in ev.verdicts))
    expect, roles = stored_expectations(RunDir(source).comparison)
    where = {role: source / Path(d).name for role, d in roles.items()}
    if "base" not in where or "pr" not in where:
        raise UsageError(f"{RunDir(source).comparison} names no base and pr runs")
    code = compare_runs(where["base"], where["pr"], where.get("base2"), target, list(expect), progress)
    return exit_codes.combined(codes, [code]), RunDir(target).index_html, errors


def _rejudge_scenario(source: Path, target: Path, progress: Progress) -> tuple[int, Path, list[str]]:
    from harness.judge.evaluate import evaluate
    from harness.orchestrate.matrix import compare_runs
    from harness.paths import PATHS
    from harness.report import write_reports
    from harness.report.matrix import matrix_summary, write_matrix
    from harness.spec.scenario import CellGroup, ModelRef

    summary = _json(RunDir(source).summary_json)
    per_build: dict[str, list] = {}
    for build, groups in scenario_runs(source).items():
        for group, run in groups.items():
            ev = evaluate(run, PATHS.get)
            write_reports(ev, (target / build / group) if build else target / group)
            model = ModelRef(group, path=ev.record.spec.model)
            per_build.setdefault(build, []).append((CellGroup(id=group, model=model, spec=ev.record.spec), ev))
    if not per_build:
        raise UsageError(f"{source}: no cell group of scenario {summary['scenario']!r} has a {RUN_RECORD}")
    comparisons: dict[str, tuple[str, int]] = {}
    for group, c in (summary.get("comparisons") or {}).items():
        stored = source / c["link"]
        expect, roles = stored_expectations(RunDir(stored.parent).comparison)
        where = {role: source / Path(d).parent.name / group for role, d in roles.items()}
        code = compare_runs(
            where["base"], where["pr"], where.get("base2"), target / "compare" / group, list(expect), progress
        )
        comparisons[group] = (c["link"], code)
    new = matrix_summary(summary["scenario"], per_build if summary.get("builds") else per_build[""], comparisons)
    index = write_matrix(target, new)
    errors = [cell for cell, v in new["cells"].items() if v["verdict"] == "ERROR"]
    return new["exit_code"], index, errors


# --- compare BASE PR ---------------------------------------------------------------------------


def comparable_pairs(
    base: str | Path, pr: str | Path, noise: str | Path | None
) -> list[tuple[str, Path, Path, Path | None]]:
    """(group, base run, pr run, base2 run) for each cell group both sides ran: one pair for two
    runs, one per shared group for two scenario directories of one build each."""
    dirs = [directory_of(d) for d in (base, pr)] + ([directory_of(noise)] if noise else [])
    kinds = [kind_of(d) for d in dirs]
    if "builds" in kinds:
        d = dirs[kinds.index("builds")]
        raise UsageError(
            f"{d} holds runs of several builds ({', '.join(builds_runs(d))}) and their comparison already; "
            f"compare two of them by name, e.g. {d}/base {d}/pr, or re-render it with 'refit-harness report {d}'"
        )
    if len(set(kinds)) > 1:
        raise UsageError(f"compare takes two runs or two scenario directories, not a mix ({', '.join(kinds)})")
    if kinds[0] == "run":
        return [("", dirs[0], dirs[1], dirs[2] if noise else None)]
    sides = []
    for d in dirs:
        runs = scenario_runs(d)
        if list(runs) != [""]:
            raise UsageError(
                f"{d} ran builds {', '.join(runs)}: compare its build directories' groups, e.g. "
                f"{d}/{next(iter(runs))}/GROUP, or re-render it with 'refit-harness report {d}'"
            )
        sides.append(runs[""])
    shared = [g for g in sides[0] if g in sides[1]]
    if not shared:
        raise UsageError(
            f"{dirs[0]} and {dirs[1]} share no cell group ({', '.join(sides[0])} vs {', '.join(sides[1])})"
        )
    return [(g, sides[0][g], sides[1][g], sides[2].get(g) if noise else None) for g in shared]
