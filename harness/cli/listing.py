"""``refit-harness paths`` and ``refit-harness list``: what can run, without running it."""

from __future__ import annotations

import argparse


def add_parsers(sub) -> None:
    sub.add_parser("paths", help="list reload paths and where they run").set_defaults(handler=cmd_paths)
    listing = sub.add_parser("list", help="list registered scenarios and their cells")
    listing.add_argument(
        "-s",
        "--scenario",
        help="print every cell of this scenario, one per line (the names --only and --skip match)",
    )
    listing.set_defaults(handler=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.spec.regressions import RegressionsSpec, load_corpus
    from harness.spec.scenario import expand
    from scenarios import SCENARIOS

    if args.scenario:
        scenario = SCENARIOS.get(args.scenario)()
        if isinstance(scenario, RegressionsSpec):
            print("\n".join(e.id for e in load_corpus(Path(scenario.corpus))))
        else:
            print("\n".join(c for g in expand(scenario) for c in verdict_cells(g)))
        return 0
    for name in SCENARIOS.names():
        scenario = SCENARIOS.get(name)()
        if isinstance(scenario, RegressionsSpec):
            entries = load_corpus(Path(scenario.corpus))
            ids = [e.id for e in entries]
            print(f"{name:14} {scenario.description}\n    {len(ids)} entries: {', '.join(ids[:4])}, ...")
            continue
        groups = expand(scenario)
        cells = [c for g in groups for c in verdict_cells(g)]
        runs = sum(len(g.spec.paths) for g in groups)
        print(
            f"{name:14} {scenario.description}\n    {len(cells)} cells ({runs} path runs): {', '.join(cells[:4])}"
            + (", ..." if len(cells) > 4 else "")
        )
        if scenario.builds:
            expect = ", ".join(f"{b}: {v}" for b, v in scenario.expect.items()) or "no cell worse on the last"
            print(f"    builds: {', '.join(scenario.builds)} (give each as --build NAME=PATH); expect {expect}")
    return 0


def verdict_cells(group) -> list[str]:
    """The cells a group's report will show, one per verdict: a trainer path has one per
    optimizer step (``trainer_steps@T1[group]``), so the count is the report's."""
    from harness.judge.evaluate import step_verdict_name
    from harness.paths import PATHS

    cells = []
    for p in group.spec.paths:
        if getattr(PATHS.get(p), "trains", False):
            steps = range(1, group.spec.trainer.steps + 1)
            cells += [f"{step_verdict_name(p, k)}[{group.id}]" for k in steps]
        else:
            cells.append(f"{p}[{group.id}]")
    return cells


def cmd_paths(args: argparse.Namespace) -> int:
    from harness.paths import PATHS
    from harness.settings import EXTRA_PATHS_ENV
    from harness.spec.known_issues import KNOWN_ISSUES

    for name in PATHS.names():
        cls = PATHS.get(name)
        reason = cls.unavailable_reason()
        where = "cpu+gpu" if cls.device == "any" else "gpu only"
        print(
            f"{name:28} {where:9} {'available' if reason is None else 'unavailable here'}\n    {cls.exercises}"
            f"\n    sabotaged twin ({cls.sabotage_evidence} evidence): {cls.sabotage}"
        )
        for known in cls.known_issues:
            scope = "".join(
                (
                    f", {'/'.join(known.dtypes)}" if known.dtypes else "",
                    f", CPUs with {' or '.join(known.cpu_capabilities)}" if known.cpu_capabilities else "",
                )
            )
            print(f"    known issue on {known.where}{scope} (XFAIL while it holds): {known.reason}")
        for refusal in cls.refusals:
            print(f"    declined by vLLM on {refusal.device} (SKIPPED with vLLM's words): {refusal.reason}")
        if name in PATHS.third_party:
            source = PATHS.third_party[name]
            origin = f"{source} (not installed)" if source == EXTRA_PATHS_ENV else f"the installed package {source}"
            print(f"    third-party path, from {origin}")
    for name, why in PATHS.refused.items():
        print(f"{name:28} refused   {why}")
    for known in KNOWN_ISSUES:
        scope = (
            f"{known.where}, vLLM {' or '.join(known.vllm) or 'any'}, "
            f"{', '.join(known.architectures) or 'any architecture'}, paths {', '.join(known.paths) or 'all'}"
            + (f", {'/'.join(known.dtypes)}" if known.dtypes else "")
            + (f", CPUs with {' or '.join(known.cpu_capabilities)}" if known.cpu_capabilities else "")
        )
        print(f"known issue ({scope}; XFAIL while it holds): {known.title or known.reason}")
    return 0
