"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process it spawns (front end, engine core, workers), which is
the only way a registration reaches the workers. It registers the harness's planted-bug
fixture models, lazily by ``module:Class`` so nothing heavy is imported here.
"""

from __future__ import annotations

FIXTURE_ARCHITECTURES = {
    "StaleQKNormQwen3ForCausalLM": "harness.fixtures.models:StaleQKNormQwen3ForCausalLM",
    "FixedQKNormQwen3ForCausalLM": "harness.fixtures.models:FixedQKNormQwen3ForCausalLM",
}


def register() -> None:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in FIXTURE_ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
