"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process it spawns (front end, engine core, workers), which is
the only way a registration reaches the workers. It registers, lazily by
``module:Class``:
- the harness's planted-bug fixture models, and its planted quantization methods;
- any architectures named in ``REFIT_HARNESS_MODELS`` (``Arch=module:Class`` pairs,
  comma-separated), so a user can test an out-of-tree model without an entry point
  of their own. The variable is inherited by every spawned process.

First of all it applies the CPU capability override of ``REFIT_HARNESS_CPU_ISA``
(``harness.worker.cpu_dispatch``), so every vLLM process sees the same CPU as the arm.
"""

from __future__ import annotations

import os

from harness.settings import EXTRA_MODELS_ENV
from harness.spec.architectures import FIXTURE_ARCHITECTURES, FIXTURE_QUANT_METHODS, extra_architectures


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
    register_fixture_quantization()


def register_fixture_quantization() -> None:
    """The planted quant methods, under their ``quant_method`` names. vLLM's registry takes a
    class, not a ``module:Class`` string, so their module is imported here (it imports only
    vLLM's quantization base classes)."""
    import importlib

    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    for name, target in FIXTURE_QUANT_METHODS.items():
        if name in QUANTIZATION_METHODS:
            continue  # the plugin runs once per process, but be idempotent
        module, _, cls = target.partition(":")
        register_quantization_config(name)(getattr(importlib.import_module(module), cls))


def register_gloo_transfer() -> None:
    """The CPU twin of the NCCL weight-transfer backend, in both of vLLM's factories."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from harness.worker.vllm_private import transfer_backend_registered

    for factory, cls in (
        (WeightTransferEngineFactory, "GlooWeightTransferEngine"),
        (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine"),
    ):
        if not transfer_backend_registered(factory, "gloo"):  # the plugin runs once per process, but be idempotent
            factory.register_engine("gloo", "harness.machinery.transfer", cls)
