"""Quantized engines: the zoo's tiny Qwen3 written by the harness in each on-disk quantized
format vLLM loads (``harness.checkpoints.quantize``), on every CPU path, in bf16.
``refit-harness run -s quantized`` gives a format x path verdict grid; a format whose kernel
this CPU lacks is SKIPPED with vLLM's words (see docs/quantized.md)."""

from harness.checkpoints.zoo import QUANTIZED_FAMILIES
from harness.spec.scenario import ModelRef, ScenarioSpec
from scenarios.default import CPU_PATHS

QUANTIZED_MODELS = tuple(ModelRef(label=f.label, builder=f"zoo:{f.label}") for f in QUANTIZED_FAMILIES)


def quantized() -> ScenarioSpec:
    return ScenarioSpec(
        name="quantized",
        description=f"{len(QUANTIZED_FAMILIES)} quantized checkpoint formats x every CPU path, bf16",
        models=QUANTIZED_MODELS,
        paths=CPU_PATHS,
        dtypes=("bfloat16",),
    )
