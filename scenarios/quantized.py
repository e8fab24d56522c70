"""Quantized engines, on every CPU path, in bf16: the zoo's tiny Qwen3 written by the harness in
each on-disk quantized format vLLM loads (``harness.checkpoints.quantize``), and float
checkpoints run with vLLM's online quantization (``quantization=`` as an engine argument of the
family). ``refit-harness run -s quantized`` gives a format x path verdict grid; a format whose
kernel this CPU lacks is SKIPPED with vLLM's words (docs/quantized.md has the measured grid)."""

from harness.checkpoints.zoo import ONLINE_QUANT_FAMILIES, QUANTIZED_FAMILIES
from harness.spec.scenario import ModelRef, ScenarioSpec
from scenarios.default import CPU_PATHS

QUANTIZED_MODELS = tuple(ModelRef(label=f.label, builder=f"zoo:{f.label}") for f in QUANTIZED_FAMILIES) + tuple(
    ModelRef(label=f.label, builder=f"zoo:{f.label}", engine_args=f.engine_args) for f in ONLINE_QUANT_FAMILIES
)


def quantized() -> ScenarioSpec:
    return ScenarioSpec(
        name="quantized",
        description=f"{len(QUANTIZED_FAMILIES)} quantized checkpoint formats and {len(ONLINE_QUANT_FAMILIES)} online "
        "quantizations x every CPU path, bf16",
        models=QUANTIZED_MODELS,
        paths=CPU_PATHS,
        dtypes=("bfloat16",),
    )
