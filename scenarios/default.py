"""Scenarios on the embedded tiny Qwen3: what ``make run`` and CPU CI exercise."""

from harness.spec.engine_config import EngineConfig
from harness.spec.scenario import ModelRef, ScenarioSpec

TINY = ModelRef(label="tiny-qwen3", builder="tiny-qwen3")
# The kernel-format reload needs vLLM's sharded-state saver, which raises on some engines
# (DeepSeek-V2, fp8): the planner runs it, and its twin, after every other segment and twin of
# its engine (``ReloadPath.runs_last``), whatever this order says.
CPU_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "discard_reload",
    "reload_kernel_format",
    "transfer_gloo",
    "trainer_steps",
    "trainer_steps_gloo",
    "http_reload",
    "http_weight_transfer",
    "dummy_start",
    "sharded_state",
    "prefix_cache",
    "compiled",
)
# A data-parallel engine (two engine cores) on the tiny model only: the zoo's MoE families would
# run DP ranks that all-reduce every step, a cell of their own still unmeasured.
DATA_PARALLEL_PATHS = ("http_dp_reload",)
# The paths whose refit runs vLLM's reload lifecycle (reload_weights, or a weight-transfer engine's
# start/finish), so the reload mode changes them; the rest are the same cells in either mode.
DIRECT_PATHS = ("reload_weights", "reload_weights_iterator", "transfer_gloo", "http_reload")
ENGINE_CONFIGS = (
    EngineConfig(),
    # VLLM_RELOAD_MODE=direct (vLLM 0.34+): SKIPPED, declined, on an older vLLM.
    EngineConfig(label="direct", reload_mode="direct", paths=DIRECT_PATHS),
)


def default() -> ScenarioSpec:
    return ScenarioSpec(
        name="default",
        description="every CPU-capable reload path on the embedded tiny Qwen3 (one on a data-parallel "
        "engine), and the reload paths again in vLLM's direct reload mode (0.34+)",
        models=(TINY,),
        paths=CPU_PATHS + DATA_PARALLEL_PATHS,
        engine_configs=ENGINE_CONFIGS,
    )


def smoke() -> ScenarioSpec:
    return ScenarioSpec(
        name="smoke",
        description="reload_weights and the gloo transfer twin on the tiny Qwen3",
        models=(TINY,),
        paths=("reload_weights", "transfer_gloo"),
    )


# The seed bug's class: a float32 copy built by the model-level post-load hook. vLLM 0.34 reruns
# that hook after every reload, so a release check of 0.32 against 0.34 shows it fixed.
COLD_START_COPY = ModelRef(label="stale-qk-norm", builder="tiny-qwen3:StaleQKNormQwen3ForCausalLM")


def pr_review() -> ScenarioSpec:
    """Two builds of vLLM, e.g. main and a PR: ``run -s pr-review --build base=... --build pr=...``.
    No expected verdicts, so the implied one holds: no cell worse on pr than on base; a cell FAIL
    or XFAIL on base and PASS on pr is named ``fixed in vLLM X``."""
    return ScenarioSpec(
        name="pr-review",
        description="base vs pr (vLLM builds) on the refit paths of the tiny Qwen3 and of the seed bug's fixture",
        models=(TINY, COLD_START_COPY),
        paths=("reload_weights", "reload_weights_iterator", "transfer_gloo"),
        builds=("base", "pr"),
    )
