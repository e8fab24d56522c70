"""Every ``REFIT_HARNESS_*`` environment variable, the cache root and the run-directory
layout, in one place. Stdlib only: builds read it before anything else is installed."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "REFIT_HARNESS_CACHE"
"""Root of every cache (models, derived checkpoints, references, build venvs)."""
DEFAULT_CACHE = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "refit-harness"))
"""The cache root of this process."""

REUSE_ENV = "REFIT_HARNESS_REUSE_REFERENCE"
"""``1`` turns reference reuse on by default (the pytest plugin sets it; the CLI's default is off)."""
EXTRA_MODELS_ENV = "REFIT_HARNESS_MODELS"
"""``Arch=module:Class`` pairs (comma-separated) the vLLM plugin registers in every vLLM process."""
EXTRA_PATHS_ENV = "REFIT_HARNESS_PATHS"
"""``name=module:Class`` pairs (comma-separated): reload paths registered from importable modules
without installing a package (held to the same contract as entry-point paths); every process of a
run inherits it, so the arms find the same classes."""
PLANTED_FAULT_ENV = "REFIT_HARNESS_PLANTED_FAULT"
"""A fixture model's planted failure (``raise:N``, ``hang:N``...), for the fault tests."""
SCRATCH_ENV = "REFIT_HARNESS_SCRATCH"
"""The arm's scratch directory for full weight copies (set by the runner for each arm)."""
BUILD_ENV = "REFIT_HARNESS_BUILD"
"""The name of the build an arm runs under (set by ``harness.builds.venvs.build_env``)."""
OVERLAY_ENV = "REFIT_HARNESS_BUILD_OVERLAY"
"""Set by an overlay build's launcher (``harness.builds.overlay``): its packages and the
environment under them; every arm records it as ``build_overlay``."""
PATCHES_ENV = "REFIT_HARNESS_VLLM_PATCHES"
"""The patches a patched build applied to its vLLM, ``name@sha256`` joined by ``,`` (set by the
build's own ``bin/python`` launcher, so every process of an arm inherits it and records it)."""
RUN_MARKER = "REFIT_HARNESS_RUN"
"""A per-run id set by the CLI; every process of the run inherits it (arms, engine cores,
workers, servers, a local Ray's workers), so leftovers can be found."""
STAGE_DIR_ENV = "REFIT_HARNESS_STAGE_DIR"
"""Where staged checkpoints land on a Ray node (default ``<tmp>/refit-harness-stage``)."""
NIGHTLY_MODEL_ENV = "REFIT_HARNESS_NIGHTLY_MODEL"
"""The checkpoint (directory or hub id) of the ``gpu-nightly`` scenario."""
NIGHTLY_ATTENTION_ENV = "REFIT_HARNESS_NIGHTLY_ATTENTION"
"""The attention backend the ``gpu-nightly`` cells pin (default ``FLASH_ATTN``; empty: vLLM's choice)."""
GPUS_ENV = "REFIT_HARNESS_GPUS"
"""How many GPUs the planner takes this machine to have (default: ``nvidia-smi -L``); a cell
that needs more (a transfer trainer's own GPU beside the engine's) is SKIPPED with the reason."""
PROBE_GRAPHS_ENV = "REFIT_HARNESS_PROBE_GRAPHS"
"""``1`` runs the CUDA-graph read probe in every compiled arm, on the CPU too (where nothing is
captured, so it shows whether anything still reads a moved tensor's old storage)."""
PREFLIGHT_ENV = "REFIT_HARNESS_PREFLIGHT"
"""``0`` skips the preflight a GPU run starts with (``refit-harness preflight`` runs it on its own)."""
SCREENSHOTS_ENV = "REFIT_HARNESS_SCREENSHOTS"
"""Where the browser test saves its screenshots (CI artifacts)."""
CPU_ISA_ENV = "REFIT_HARNESS_CPU_ISA"
"""The CPU capability level vLLM is made to see (``native``, ``avx512_bf16``, ``avx512``, ``avx2``):
the default of ``--cpu-isa``; the arm sets it for every vLLM process it starts (``harness.cpu_isa``)."""
FORK_ARMS_ENV = "REFIT_HARNESS_FORK_ARMS"
"""``0`` starts every arm as a fresh ``python``; by default a CPU arm that a fresh process would
run the same is forked from a warm interpreter that imported vLLM once (``harness.arm.zygote``)."""
ZYGOTE_POOL_ENV = "REFIT_HARNESS_ZYGOTE_POOL"
"""A directory where CLI runs share their zygotes (``harness.orchestrate.forking.zygote_pool``
makes one): a run forks from a warm zygote another run started instead of preloading its own.
Unset or empty: each run starts its own and ends them when it exits."""
POOL_OWNER_FILE = "owner"
"""In a zygote pool's directory: the pid whose end ends the pool's zygotes."""
MARKER_PLACEHOLDER = "0" * 32
"""A pooled zygote's run marker: as long as the CLI's (``uuid4().hex``), so that each arm can
write its run's marker over it in place (``harness.arm.zygote.stamp_marker``)."""
ARMS_LANE, FLOOR_LANE = "zygote", "floor-zygote"
"""The two zygotes' names (``harness.orchestrate.forking``): the noise floor's arms fork from the
second. Their logs are ``arms/NAME.log``."""
FORKED_ARM_ENV = "REFIT_HARNESS_FORKED_ARM"
"""Set by a zygote in each arm it forks, to the zygote's name; the arm records it (``arm_process``
in its environment facts: ``fresh``, ``forked from zygote`` or ``forked from floor-zygote``)."""

DEFAULT_ARM_TIMEOUT_S = 900.0
"""An arm running longer than this is killed and marked ERROR."""

CORPUS_ENV = "REFIT_HARNESS_CORPUS"
"""Directory of the regression corpus (one sub-directory per re-injected vLLM bug); default: the
repository's ``regressions/``."""
CORPUS_DIR = Path(os.environ.get(CORPUS_ENV, Path(__file__).resolve().parents[1] / "regressions"))
