"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process it spawns (front end, engine core, workers), which is
the only way a registration reaches the workers. It registers, lazily by
``module:Class``:
- the harness's planted-bug fixture models;
- any architectures named in ``REFIT_HARNESS_MODELS`` (``Arch=module:Class`` pairs,
  comma-separated), so a user can test an out-of-tree model without an entry point
  of their own. The variable is inherited by every spawned process.

First of all it applies the CPU capability override of ``REFIT_HARNESS_CPU_ISA``
(``harness.worker.cpu_dispatch``), so every vLLM process sees the same CPU as the arm.
"""

from __future__ import annotations

import os

from harness.settings import EXTRA_MODELS_ENV
from harness.spec.architectures import FIXTURE_ARCHITECTURES, extra_architectures


def register() -> None:
    from harness.worker.cpu_dispatch import apply_from_env

    apply_from_env()
    from vllm import ModelRegistry

    register_gloo_transfer()
    supported = set(ModelRegistry.get_supported_archs())
    wanted = {**FIXTURE_ARCHITECTURES, **extra_architectures(os.environ.get(EXTRA_MODELS_ENV))}
    for arch, target in wanted.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)


def register_gloo_transfer() -> None:
    """The CPU twin of the NCCL weight-transfer backend, in both of vLLM's factories."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from harness.worker.vllm_private import transfer_backend_registered

    for factory, cls in (
        (WeightTransferEngineFactory, "GlooWeightTransferEngine"),
        (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine"),
    ):
        if not transfer_backend_registered(factory, "gloo"):  # the plugin runs once per process, but be idempotent
            factory.register_engine("gloo", "harness.arm.transfer", cls)
