"""The GPU nightly gate: a real model on every path, eager and compiled, TP 1 and 2.

The model comes from ``REFIT_HARNESS_NIGHTLY_MODEL`` (a checkpoint directory, or a hub id
on hosts with hub access), or ``--refit-model`` / ``--model`` at run time.
"""

import os

from harness.settings import NIGHTLY_MODEL_ENV
from harness.spec.scenario import ModelRef, ScenarioSpec

GPU_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "discard_reload",
    "dummy_start",
    "prefix_cache",
    "http_reload",
    "http_weight_transfer",
    "trainer_steps",
    "trainer_steps_gloo",
    "sleep_level1",
    "sleep_level2",
    "transfer_nccl",
    "transfer_ipc",
    "transfer_sparse_nccl",
    "transfer_sharded_rdt",
    "transfer_nccl_m2n",
)


def gpu_nightly() -> ScenarioSpec:
    model = os.environ.get(NIGHTLY_MODEL_ENV, "Qwen/Qwen3-0.6B")
    return ScenarioSpec(
        name="gpu-nightly",
        description=f"every path on {model}, eager+compiled, TP 1 and 2 (GPU)",
        models=(ModelRef(label=model.rstrip("/").split("/")[-1], path=model),),
        paths=GPU_PATHS,
        modes=("eager", "compiled"),
        tp_sizes=(1, 2),
        arm_timeout_s=1800.0,
        device="cuda",
    )
