"""``refit-harness preflight -s SCENARIO``: check every cell of a GPU scenario on any machine,
CPU included, without starting an engine (``harness.orchestrate.preflight``).

Exit 0 when nothing would crash or hang (cells that would be SKIPPED, with their reason, are
listed); exit 2 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import sys

from harness.cli.common import positive_int, progress
from harness.errors import UsageError


def gpu_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({positive_int(x) for x in text.split(",") if x.strip()}))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be GPU counts separated by commas, like 1,2,4, not {text!r}") from None
    if not counts:
        raise argparse.ArgumentTypeError("name at least one GPU count")
    return counts


gpu_counts.__name__ = "GPU counts"


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "preflight",
        help="check a GPU scenario's cells without a GPU: engine args, KV cache, trainers, packages, Ray placement",
    )
    p.add_argument("-s", "--scenario", help="registered scenario (refit-harness list)")
    p.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also check that this vLLM build has every vLLM name the harness uses (the version adapter's "
        "API check, under the build's interpreter); repeatable; alone, without -s, only that",
    )
    p.add_argument(
        "--gpus",
        type=gpu_counts,
        default=(1, 2, 4),
        help="GPU counts of the machines to check placement on, comma-separated (default 1,2,4)",
    )
    p.add_argument("--model", help="checkpoint directory or hub id instead of the scenario's (only its config is read)")
    p.add_argument("-v", "--verbose", action="store_true", help="also list the checks that passed")
    p.set_defaults(handler=cmd_preflight)


def check_builds(specs: list[str]) -> int:
    """The API check of each build: one line per build, one per missing name; the count missing."""
    from harness.builds.engine_fields import vllm_api
    from harness.builds.venvs import parse_build

    missing = 0
    for text in specs:
        build = parse_build(text)
        api = vllm_api(build)
        absent = [n for n in api["names"] if n["found"] is None]
        print(
            f"build {build.name}: vLLM {api['vllm']}, {len(api['names']) - len(absent)}/{len(api['names'])} names "
            f"resolved, WeightSource protocol {api['weight_source_api']}, reload modes {', '.join(api['reload_modes'])}"
        )
        for n in absent:
            print(f"build {build.name}: missing {n['name']} (used in {n['used_in']})", file=sys.stderr)
        missing += len(absent)
    return missing


def cmd_preflight(args: argparse.Namespace) -> int:
    from harness.orchestrate import preflight
    from scenarios import SCENARIOS

    if not args.scenario and not args.build:
        raise UsageError("preflight needs -s SCENARIO, --build NAME=PATH, or both")
    missing = check_builds(args.build)
    if missing:
        raise UsageError(f"preflight: {missing} vLLM name(s) the harness uses are missing from a build")
    if not args.scenario:
        return 0
    scenario = SCENARIOS.get(args.scenario)()
    request, notes = preflight.scenario_request(scenario, args.gpus, args.model)
    for note in notes:
        progress(note)
    progress(
        f"preflight of {scenario.name}: {len({c.id for c in request.cells})} cell groups on "
        f"{', '.join(map(str, args.gpus))} GPU(s)"
    )
    findings = preflight.run(request)
    for f in findings:
        if f.kind == "skip" or (f.kind == "ok" and args.verbose):
            print(f.line())
    bad = preflight.problems(findings)
    for f in bad:
        print(f.line(), file=sys.stderr)
    checked = sum(1 for f in findings if f.kind == "ok")
    if bad:
        raise UsageError(f"preflight of {scenario.name}: {len(bad)} problem(s) ({checked} checks passed)")
    print(f"preflight of {scenario.name}: no problems ({checked} checks passed)")
    return 0
