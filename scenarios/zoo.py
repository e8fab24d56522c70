"""The model zoo: one cell group per stock architecture family vLLM runs, each a tiny
random checkpoint built from a transformers config (``harness.checkpoints.zoo``), in bf16 by default
(what users run; ``--dtype float32`` for the fp32 grid). ``refit-harness run -s zoo``
gives an architecture x path verdict grid."""

from harness.checkpoints.zoo import FAMILIES
from harness.spec.scenario import ModelRef, ScenarioSpec
from scenarios.default import CPU_PATHS

ZOO_MODELS = tuple(ModelRef(label=f.label, builder=f"zoo:{f.label}") for f in FAMILIES)


def zoo() -> ScenarioSpec:
    return ScenarioSpec(
        name="zoo",
        description=f"{len(FAMILIES)} stock architecture families x every CPU path, bf16",
        models=ZOO_MODELS,
        paths=CPU_PATHS,
        dtypes=("bfloat16",),
    )
