"""Which model architectures the vLLM plugin (``harness.worker.vllm_plugin``) registers, by
``module:Class``, as plain data: the reports and the reference cache read it without vLLM."""

from __future__ import annotations

from harness.settings import EXTRA_MODELS_ENV

FIXTURE_ARCHITECTURES = {
    "StaleQKNormQwen3ForCausalLM": "harness.worker.fixtures.models:StaleQKNormQwen3ForCausalLM",
    "ReboundQKNormQwen3ForCausalLM": "harness.worker.fixtures.models:ReboundQKNormQwen3ForCausalLM",
    "InPlaceQKNormQwen3ForCausalLM": "harness.worker.fixtures.models:InPlaceQKNormQwen3ForCausalLM",
    "RegistryQKNormQwen3ForCausalLM": "harness.worker.fixtures.models:RegistryQKNormQwen3ForCausalLM",
    "InPlaceGainQwen3ForCausalLM": "harness.worker.fixtures.models:InPlaceGainQwen3ForCausalLM",
    "DerivedGainQwen3ForCausalLM": "harness.worker.fixtures.models:DerivedGainQwen3ForCausalLM",
    "FaultyReloadQwen3ForCausalLM": "harness.worker.fixtures.models:FaultyReloadQwen3ForCausalLM",
    "StaleKVScaleFloatQwen3ForCausalLM": "harness.worker.fixtures.models:StaleKVScaleFloatQwen3ForCausalLM",
    "PlainGemmQwen3ForCausalLM": "harness.worker.fixtures.models:PlainGemmQwen3ForCausalLM",
    "RootSizeNormQwen3ForCausalLM": "harness.worker.fixtures.models:RootSizeNormQwen3ForCausalLM",
    **{
        arch: f"harness.worker.fixtures.models:{arch}"
        for arch in (
            "LazyCopyQwen3ForCausalLM",
            "LazyRefreshQwen3ForCausalLM",
            "PeerGainQwen3ForCausalLM",
            "LivePeerGainQwen3ForCausalLM",
            "UnownedCacheQwen3ForCausalLM",
            "ValidatedCacheQwen3ForCausalLM",
        )
    },
    "BatchShapeQwen3ForCausalLM": "harness.worker.fixtures.models:BatchShapeQwen3ForCausalLM",
}

FIXTURE_QUANT_METHODS = {
    "refit_fixture_boot_max_scale": "harness.worker.fixtures.quant:BootMaxScaleConfig",
    "refit_fixture_fresh_max_scale": "harness.worker.fixtures.quant:FreshMaxScaleConfig",
}
"""The planted quantized fixture's quantization methods (``quantization_config.quant_method``)."""


def named_targets(env: str, value: str | None, what: str) -> dict[str, str]:
    """``name=module:Class`` pairs, comma-separated, as the ``env`` variable gives them; a malformed
    item raises ``ValueError`` naming the variable and what each name is (``Arch``, ``path``)."""
    pairs = {}
    for item in filter(None, (x.strip() for x in (value or "").split(","))):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"{env}: expected {what}=module:Class, got {item!r}")
        pairs[name.strip()] = target.strip()
    return pairs


def extra_architectures(value: str | None) -> dict[str, str]:
    return named_targets(EXTRA_MODELS_ENV, value, "Arch")
