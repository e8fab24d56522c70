"""Derived state across vLLM's reload lifecycles: the planted bugs that vLLM 0.34's rerun of every
module's post-load hook fixes (a copy built by the model-level hook) and those it cannot reach (a
copy made on the first forward, a quant-method hook reading a layer not yet reloaded, a cache no
module owns), each beside its fixed twin, in both reload modes. Run it on every vLLM build
(``--build``): on 0.32 every bug FAILs; on 0.34 the model-level-hook ones PASS, correctly."""

from harness.spec.engine_config import EngineConfig
from harness.spec.scenario import ModelRef, ScenarioSpec

FIXTURE_PAIRS = (
    # (planted bug, fixed twin)
    ("StaleQKNormQwen3ForCausalLM", "InPlaceQKNormQwen3ForCausalLM"),  # model-level hook: fixed by 0.34
    ("RegistryQKNormQwen3ForCausalLM", "InPlaceQKNormQwen3ForCausalLM"),  # the same, in a module-level dict
    ("LazyCopyQwen3ForCausalLM", "LazyRefreshQwen3ForCausalLM"),
    ("PeerGainQwen3ForCausalLM", "LivePeerGainQwen3ForCausalLM"),
    ("UnownedCacheQwen3ForCausalLM", "ValidatedCacheQwen3ForCausalLM"),
)
FIXED_BY_HOOK_RERUN = ("StaleQKNormQwen3ForCausalLM", "RegistryQKNormQwen3ForCausalLM")
"""The bugs whose copy a model-level ``process_weights_after_loading`` builds: vLLM 0.34 reruns it."""
PATHS = ("reload_weights", "transfer_gloo")


def _label(architecture: str) -> str:
    return architecture.removesuffix("Qwen3ForCausalLM").lower()


def reload_lifecycle() -> ScenarioSpec:
    archs = dict.fromkeys(a for pair in FIXTURE_PAIRS for a in pair)
    return ScenarioSpec(
        name="reload-lifecycle",
        description="planted derived-state bugs vs their fixed twins, layerwise and direct reload (0.34+)",
        models=tuple(ModelRef(label=_label(a), builder=f"tiny-qwen3:{a}") for a in archs),
        paths=PATHS,
        engine_configs=(EngineConfig(), EngineConfig(label="direct", reload_mode="direct")),
    )
