"""``refit-harness review PR.diff``: a vLLM PR checked in one command.

The PR's diff is split (``harness.builds.review``): what changes the installed ``vllm/``
package becomes the *pr* build, an overlay of the base environment with those files patched
(seconds, nothing installed); the rest is listed with the reason it was left out. Then it is
a run of three builds: ``base`` (the environment as it is), ``base2`` (the same again: the
run-to-run floor) and ``pr``, with each path's sabotaged twin, and their comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.cli.common import positive_int, progress, set_out
from harness.errors import UsageError


def add_parsers(sub) -> None:
    from scenarios.default import pr_review

    review = sub.add_parser(
        "review",
        help="check a vLLM PR's diff: base, base again (the floor) and the PR as a patched build, compared",
    )
    review.set_defaults(handler=cmd_review)
    review.add_argument("diff", help="the PR's unified diff, e.g. from 'git diff main...pr' or GitHub's .diff URL")
    review.add_argument(
        "--base-env",
        metavar="VENV_OR_PYTHON",
        help="the environment whose vLLM is the base and is patched for pr (default: the harness's own); never written",
    )
    review.add_argument(
        "--fuzz",
        type=positive_int,
        default=0,
        metavar="N",
        help="let a hunk that does not apply as it is drop up to N leading and trailing context lines, as "
        "'patch --fuzz' does (default: none; the report says which hunks needed it)",
    )
    review.add_argument(
        "--paths",
        default=",".join(pr_review().paths),
        help="comma-separated reload paths (default: the pr-review scenario's)",
    )
    review.add_argument("--model", help="checkpoint A directory (default: the embedded tiny Qwen3)")
    review.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="model dtype (default: float32)")
    review.add_argument("--mode", choices=("eager", "compiled"), help="engine mode (default: eager)")
    review.add_argument(
        "--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="a vLLM engine argument; repeatable"
    )
    review.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="NAME[:PATH_GLOB]=VERDICT",
        help="expected verdicts, e.g. base=FAIL pr=PASS for a fix (default: no cell worse on pr than on base)",
    )
    review.add_argument("--out", help="report directory (default: reports/review-<timestamp>)")


def cmd_review(args: argparse.Namespace) -> int:
    from harness.builds.patched import create_patched_build
    from harness.builds.patches import read_patch
    from harness.builds.review import review_markdown, split_diff
    from harness.builds.venvs import build_facts, interpreter
    from harness.cli import build_parser
    from harness.cli.run import cmd_run
    from harness.run_dir import RunDir
    from harness.spec.build import BuildSpec
    from harness.store import write_atomic

    patch = read_patch(args.diff)
    base = interpreter(args.base_env) if args.base_env else Path(sys.executable)
    facts = build_facts(BuildSpec("base", str(base)))
    if facts.get("vllm_patches"):
        raise UsageError(f"--base-env {base} is itself a patched build: give the environment it patches")
    split = split_diff(patch, Path(facts["vllm_path"]), args.fuzz, facts.get("vllm", ""))
    out = set_out(Path(args.out or Path("reports") / f"review-{time.strftime('%Y%m%d-%H%M%S')}"))
    out.mkdir(parents=True, exist_ok=True)
    for p in split.parts:
        progress(f"{'applied' if p.applied else 'left out'}: {p.path}: {p.reason}")
    record = {
        "diff": str(args.diff),
        "diff_sha256": patch.sha256,
        "base": str(base),
        "vllm": facts.get("vllm"),
        "fuzz": split.fuzz,
        "parts": [{"path": p.path, "applied": p.applied, "reason": p.reason} for p in split.parts],
    }
    write_atomic(RunDir(out).review_record, json.dumps(record, indent=2))
    section = review_markdown(split, Path(args.diff).name)
    if split.testable is None:
        write_atomic(RunDir(out).summary_md, "\n".join(["## refit-harness review", "", *section]))
        progress(f"nothing testable changed: no file of the installed vllm/ package is changed by {args.diff}")
        print(f"review: {RunDir(out).summary_md.resolve()}")
        return 0
    write_atomic(out / "testable.diff", split.testable.text)
    pr = create_patched_build(base, (split.testable,), log=progress, base_spec=f"review of {Path(args.diff).name}")
    argv = ["run", "--build", f"base={base}", "--build", f"pr={pr}", "--paths", args.paths, "--out", str(out)]
    for flag, value in (("--model", args.model), ("--dtype", args.dtype), ("--mode", args.mode)):
        if value:
            argv += [flag, value]
    for flag, values in (("--engine-arg", args.engine_arg), ("--expect", args.expect)):
        for v in values:
            argv += [flag, v]
    code = cmd_run(build_parser().parse_args(argv))
    summary = RunDir(out).summary_md
    if summary.is_file():  # the comparison's PR comment, with what the review tested
        write_atomic(summary, summary.read_text() + "\n" + "\n".join(section))
    return code
