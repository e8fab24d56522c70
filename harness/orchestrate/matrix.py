"""The scenario x builds loop, shared by ``refit-harness run -s`` and the pytest plugin:
each cell group is one run (``run_group``); with builds, every group runs once per build
(the noise build twice) and each group's base/pr pair is compared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from harness.checkpoints.builders import with_model
from harness.judge.evaluate import evaluate
from harness.judge.evaluation import Evaluation
from harness.orchestrate.execute import ArmEvents, Progress, execute
from harness.orchestrate.fanout import FanoutSpec
from harness.paths import PATHS
from harness.run_dir import INDEX_HTML, RunDir
from harness.spec.build import BuildSpec
from harness.spec.run import RunSpec
from harness.spec.scenario import CellGroup, ScenarioSpec


def build_sequence(build_specs: tuple[BuildSpec, ...], noise_arg: str | None):
    """[(run name, build)] in run order (the noise build again as NAME2 right after it), the
    labels base/pr/base2 of those run names, and the noise run's name (or None)."""
    from harness.errors import UsageError

    names = [b.name for b in build_specs]
    noise = noise_arg if noise_arg is not None else (names[0] if len(names) > 1 else "none")
    if noise != "none" and noise not in names:
        raise UsageError(f"--noise-build {noise!r} is not one of the --build names {names}")
    sequence = [(b.name, b) for b in build_specs]
    if noise != "none":
        sequence.insert(names.index(noise) + 1, (noise + "2", build_specs[names.index(noise)]))
    labels = {names[0]: "base", names[-1]: "pr"}
    base2 = noise + "2" if noise == names[0] else None  # only base run again is base2
    if base2:
        labels[base2] = "base2"
    return sequence, labels, base2


def relabel(expect: str, labels: dict[str, str]) -> str:
    """An ``--expect NAME[:GLOB]=VERDICT`` with the build's name replaced by base/pr/base2."""
    name, sep, rest = expect.partition("=")
    build, colon, cells = name.partition(":")
    return f"{labels.get(build, build)}{colon}{cells}{sep}{rest}"


Interrupted = Callable[[KeyboardInterrupt, Callable[[], Path]], object]
"""What a caller does when Ctrl-C (or SIGTERM/SIGHUP) stops the matrix: it is given the
interrupt and a function that writes the report of what finished."""


def compare_runs(
    base: Path,
    pr: Path,
    base2: Path | None,
    out: Path,
    expect: list[str],
    progress: Progress,
    allow_cpu_mismatch: bool = False,
    allow_model_mismatch: bool = False,
) -> int:
    """Compare two finished runs (and the base run again, the noise floor) from their records,
    write the comparison page in ``out``; its exit code (expectations met or not)."""
    import shlex
    import sys

    from harness.judge.crossbuild import compare_builds, parse_expectation
    from harness.report.compare_page import write_comparison
    from harness.report.provenance import run_provenance

    expectations = tuple(parse_expectation(e) for e in expect)
    evs = [evaluate(d, PATHS.get) for d in (base, pr)]
    cmp = compare_builds(
        evs[0],
        evs[1],
        evaluate(base2, PATHS.get) if base2 else None,
        dirs=(base, pr, base2),
        expectations=expectations,
        command=shlex.join(["refit-harness", *sys.argv[1:]]),
        allow_cpu_mismatch=allow_cpu_mismatch,
        allow_model_mismatch=allow_model_mismatch,
    )
    files = write_comparison(cmp, out, {label: run_provenance(ev) for label, ev in zip(("base", "pr"), evs)})
    for e in cmp.expectations:
        got = ", ".join(f"{p} {v}" for p, v in e.actual) or ("no cell regressed" if e.implied else "no cell")
        progress(
            f"expect {e.expectation.build} {e.expectation.verdict} on {e.expectation.cells}: "
            f"{'met' if e.met else 'NOT met'} ({got})"
        )
    print(f"comparison: {files[INDEX_HTML].resolve()}")
    return cmp.exit_code


def run_group(
    group: CellGroup,
    out: Path,
    progress: Progress,
    *,
    fan: FanoutSpec | None,
    model: str | None = None,
    build: BuildSpec | None = None,
    resume: bool = False,
    reuse_reference: bool = False,
    amend: Callable[[RunSpec], RunSpec] = lambda spec: spec,
    events: ArmEvents | None = None,
) -> tuple[CellGroup, Evaluation]:
    """One cell group, run and reported in ``out``: the group with its model resolved, and
    its evaluation. ``amend`` adds what the command line gives every cell."""
    from harness.report import write_reports

    group = with_model(group, model)
    spec = amend(replace(group.spec, build=build) if build else group.spec)
    evaluation = execute(spec, out, progress, fan=fan, resume=resume, reuse_reference=reuse_reference, events=events)
    write_reports(evaluation, out)
    return group, evaluation


def run_matrix(
    scenario: ScenarioSpec,
    groups,
    out: Path,
    build_specs: tuple[BuildSpec, ...] = (),
    *,
    fan: FanoutSpec | None,
    progress: Progress,
    on_interrupt: Interrupted,
    model: str | None = None,
    noise_build: str | None = None,
    expect: tuple[str, ...] = (),
    resume: bool = False,
    reuse_reference: bool = False,
    amend: Callable[[RunSpec], RunSpec] = lambda spec: spec,
    events: ArmEvents | None = None,
):
    """Every group (per build), then the per-group comparisons; returns the matrix summary
    and the path of its index page. On Ctrl-C, ``on_interrupt`` gets the interrupt and a
    function that writes the matrix of what finished."""
    from harness.report.matrix import matrix_summary, write_matrix

    say = progress
    sequence = build_sequence(build_specs, noise_build)[0] if build_specs else [("", None)]
    per_build: dict[str, list] = {}
    for name, build in sequence:
        where = out / name if name else out
        results = per_build.setdefault(name, [])
        for group in groups:
            say(f"cell group {group.id}" + (f" on build {name}" if name else "") + f": {', '.join(group.spec.paths)}")
            try:
                # Builds are compared against their own references: no reuse across them.
                results.append(
                    run_group(
                        group,
                        where / group.id,
                        say,
                        fan=fan,
                        model=model,
                        build=replace(build, name=name) if build else None,
                        resume=resume,
                        reuse_reference=reuse_reference and not build_specs,
                        amend=amend,
                        events=events,
                    )
                )
            except KeyboardInterrupt as exc:
                on_interrupt(
                    exc, partial(report_so_far, scenario, per_build, results, out, where / group.id, group, model)
                )
                raise
    comparisons = compare_groups(scenario, build_specs, per_build, out, expect, noise_build, say) if build_specs else {}
    summary = matrix_summary(scenario.name, per_build, comparisons)
    return summary, write_matrix(out, summary)


def report_so_far(
    scenario: ScenarioSpec,
    per_build: dict[str, list],
    results: list,
    out: Path,
    where: Path,
    group: CellGroup,
    model: str | None,
) -> Path:
    """The matrix of what finished when the run was interrupted; the group cut short (run in
    ``where``, one of ``results``'s build) is in it when its run got as far as ``run.json``."""
    from harness.report import write_reports
    from harness.report.matrix import matrix_summary, write_matrix

    if RunDir(where).record.exists():
        ev = evaluate(where, PATHS.get)
        write_reports(ev, where)
        results.append((with_model(group, model), ev))
    return write_matrix(out, matrix_summary(scenario.name, per_build))


def compare_groups(
    scenario: ScenarioSpec,
    build_specs: tuple[BuildSpec, ...],
    per_build: dict[str, list],
    out: Path,
    expect: tuple[str, ...],
    noise_build: str | None,
    say: Progress,
) -> dict[str, tuple[str, int]]:
    """Each group's base/pr comparison (with base2, the noise floor): its page and exit code, by group id."""
    _, labels, base2 = build_sequence(build_specs, noise_build)
    base, pr = build_specs[0].name, build_specs[-1].name
    expectations = [f"{b}={v}" for b, v in scenario.expect.items()] + list(expect)
    comparisons: dict[str, tuple[str, int]] = {}
    for group, _ in per_build[base]:
        code = compare_runs(
            out / base / group.id,
            out / pr / group.id,
            out / base2 / group.id if base2 else None,
            out / "compare" / group.id,
            [relabel(e, labels) for e in expectations],
            say,
        )
        comparisons[group.id] = (f"compare/{group.id}/{INDEX_HTML}", code)
    return comparisons
