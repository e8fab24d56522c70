"""Paths defined by the state the engine is in around the reload: started from dummy
weights, prefix caching on, compiled, asleep. Each reuses a reload path for the refit
itself and adds only what its state needs."""

from __future__ import annotations

from harness.paths import reload_path
from harness.paths.reload_weights import ReloadWeightsFromDirectory, ReloadWeightsFromIterator
from harness.spec.requirements import EngineRequirements

CPU_SLEEP = (
    "vLLM's CPUWorker.sleep() and wake_up() only log a warning and do nothing, so a sleep path "
    "cannot be judged on the CPU; it runs on CUDA through the cumem allocator"
)


@reload_path
class DummyStart(ReloadWeightsFromIterator):
    # reload_weights(weights_path=...) asks the engine's own loader for the weights, and
    # vLLM's dummy loader has none ("Model reloading with `dummy` format" is not
    # implemented); in-memory tensors are how such an engine gets real weights.
    name = "dummy_start"
    exercises = (
        "LLM(load_format='dummy'): post-load hooks and lazy caches see random weights; then "
        "reload_weights(weights_iterator=...) to B, as RL frameworks feed a dummy-started engine. "
        "The witness for STALE is the dummy state"
    )
    requirements = EngineRequirements(load_format="dummy")
    refit_targets = ("B", "B", "B_control")  # there is no cold A to round-trip to
    sabotage = "the positive-control tensor left out of the weights iterator, so it keeps its dummy value"
    sabotage_targets = ("B",)


@reload_path
class PrefixCacheCoherence(ReloadWeightsFromDirectory):
    name = "prefix_cache"
    exercises = (
        "enable_prefix_caching=True: the prompts (sharing a prefix of several KV blocks) run right before "
        "the refit to fill the cache, and after it. vLLM's own RLHF recipe (reload_weights, then "
        "LLM.reset_prefix_cache()); anything served from pre-refit KV shows as a token divergence from "
        "cold B. The path requires prefix-cache hits after the refit, or it proves nothing"
    )
    requirements = EngineRequirements(enable_prefix_caching=True)
    sabotage = "reload_weights without reset_prefix_cache(): KV computed with the old weights stays servable"
    sabotage_evidence = "tokens"
    needs_cache_hits = True

    def refit(self, engine, checkpoint_dir, target, reset: bool = True):
        engine.generate(self.prompts)  # fill the cache with KV computed from the weights before the refit
        super().refit(engine, checkpoint_dir, target)
        if reset:
            engine.call("reset_prefix_cache")

    def sabotaged_refit(self, engine, target):
        self.refit(engine, self.checkpoints.directory(target), target, reset=False)


@reload_path
class CompiledReload(ReloadWeightsFromDirectory):
    name = "compiled"
    exercises = (
        "reload_weights in a compiled engine (torch.compile; CUDA graphs on GPU), judged against the eager "
        "cold-B reference: a compiled-vs-eager differential and an address-stability check in one"
    )
    requirements = EngineRequirements(mode="compiled")


@reload_path
class SleepLevel1(ReloadWeightsFromDirectory):
    name = "sleep_level1"
    exercises = (
        "reload_weights to the target, then sleep(level=1) (weights offloaded) and wake_up(): each "
        "observation is what wake_up restored, so it must equal the pre-sleep state, which is cold B"
    )
    device = "cuda"
    cpu_skip_reason = CPU_SLEEP
    requirements = EngineRequirements(enable_sleep_mode=True)
    sabotage = (
        "reload_weights, sleep(level=1), the positive-control tensor's bytes zeroed in the CPU copy wake_up "
        "restores, wake_up(): a wake-up that restores nothing for that tensor"
    )

    def sabotaged_refit(self, engine, target):
        # The engine is at the target before it sleeps, as in the real refit: only the restore is
        # broken, so the twin is caught only if an observation after wake_up sees what it restored.
        self.refit(engine, self.checkpoints.directory(target), target, break_restore=True)

    def refit(self, engine, checkpoint_dir, target, break_restore: bool = False):
        # Reload first, so that nothing after wake_up can mask what it failed to restore; a
        # reload_weights PASS beside this path puts a failure on sleep/wake.
        super().refit(engine, checkpoint_dir, target)
        engine.call("sleep", level=1)
        if break_restore:
            engine.rpc("refit_harness_zero_sleep_backup", {"names": [self.left_out]})
        engine.call("wake_up")


@reload_path
class SleepLevel2(ReloadWeightsFromDirectory):
    name = "sleep_level2"
    exercises = (
        "sleep(level=2) discards weights; wake_up(tags=['weights']), reload_weights to the target, "
        "wake_up(tags=['kv_cache']) (vLLM #29341: garbage after wake without a reload)"
    )
    device = "cuda"
    cpu_skip_reason = CPU_SLEEP
    requirements = EngineRequirements(enable_sleep_mode=True)

    sabotage = (
        "sleep(level=2), one model buffer zeroed in the CPU copies vLLM saved (the rotary cos_sin_cache where "
        "there is one), wake_up(tags=['weights']), reload_weights, wake_up(tags=['kv_cache']): a wake-up that "
        "restores nothing for a buffer no reload rewrites"
    )
    # The damaged buffer is chosen in the worker (its census name is the model's); what it breaks
    # shows in every attention layer's output.
    sabotage_evidence = "tokens"

    def refit(self, engine, checkpoint_dir, target, break_restore: bool = False):
        engine.call("sleep", level=2)
        if break_restore:
            engine.rpc("refit_harness_zero_sleep_saved_buffer", {})
        engine.call("wake_up", tags=["weights"])
        super().refit(engine, checkpoint_dir, target)
        engine.call("wake_up", tags=["kv_cache"])

    def sabotaged_refit(self, engine, target):
        # The reload is real: only level 2's own restore is broken, so the twin is caught only if an
        # observation after wake_up sees what the saved buffers restored.
        self.refit(engine, self.checkpoints.directory(target), target, break_restore=True)
