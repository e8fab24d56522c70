"""``refit-harness make-model``: write the embedded tiny Qwen3, a fixture or a zoo family."""

from __future__ import annotations

import argparse


def add_parsers(sub) -> None:
    model = sub.add_parser(
        "make-model", help="write the embedded tiny Qwen3 (or a planted-bug fixture) and print its path"
    )
    model.set_defaults(handler=cmd_make_model)
    model.add_argument("--architecture", default=None, help="e.g. StaleQKNormQwen3ForCausalLM")
    model.add_argument(
        "--family", default=None, help="a zoo family instead, e.g. mamba2 (see harness/checkpoints/zoo.py)"
    )


def cmd_make_model(args: argparse.Namespace) -> int:
    if args.family:
        from harness.checkpoints.zoo import tiny_model

        print(tiny_model(args.family))
        return 0
    from harness.checkpoints.tiny import tiny_qwen3

    print(tiny_qwen3(architecture=args.architecture))
    return 0
