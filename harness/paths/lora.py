"""LoRA refits: an adapter reloaded in place under the same name and id, as LoRA RL
(verl, SkyRL, TRL) swaps a trained adapter into its engine; and a base-weights refit while an
adapter is served."""

from __future__ import annotations

import shutil
import tempfile

from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath, scratch_root
from harness.paths.reload_weights import ReloadWeightsFromDirectory
from harness.spec.known_issues import THROUGH_034, KnownIssue
from harness.spec.requirements import EngineRequirements, RefitTarget


@reload_path
class LoRAInPlace(ReloadPath):
    name = "lora_inplace"
    exercises = (
        "enable_lora; adapter A serves the prompts; then add_lora(LoRARequest(same name, same id, path of B, "
        "load_inplace=True)): vLLM's LRU worker LoRA manager reloads the adapter into its slot (lora_a_stacked, "
        "lora_b_stacked); judged against a cold LoRA engine serving B. A, B, B' are adapters (--lora, "
        "--lora-target); the base stays at A"
    )
    requirements = EngineRequirements(lora="adapter")
    sabotage = (
        "the same LoRARequest without load_inplace=True: vLLM finds the id already loaded and keeps serving the "
        "cached adapter"
    )

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.serve_adapter(checkpoint_dir, load_inplace=True)

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        engine.serve_adapter(self.checkpoints.directory(target), load_inplace=False)


@reload_path
class LoRAInPlacePrefixCache(LoRAInPlace):
    name = "lora_inplace_prefix_cache"
    exercises = (
        "lora_inplace with prefix caching on (vLLM's default): each target adapter at its own path, so the "
        "block hashes (keyed on the adapter's name and path since vLLM 0.32) change with the adapter"
    )
    requirements = EngineRequirements(lora="adapter", enable_prefix_caching=True)


VLLM_42125 = KnownIssue(
    # The block hashes are computed by the scheduler, the same on every device.
    device=None,
    finding="docs/findings/lora-inplace-same-path-stale-prefix-cache.md",
    vllm=THROUGH_034,  # 0.34 keys the blocks the same way: `-s rl-paths --build` and the repro, 2026-12-04
    reason=(
        "vLLM keys a LoRA request's prefix-cache blocks on the adapter's name and path only "
        "(v1/core/kv_cache_utils._gen_lora_extra_hash_keys), so after an in-place reload of new adapter weights "
        "written at the same path, the prompts are served from KV blocks computed with the previous adapter "
        "(vllm #42125; PR #48352 keys on a content digest). Measured on 0.32 and a 0.34 CPU build with vLLM alone: "
        "repro/lora_inplace_same_path_stale_prefix_cache.py"
    ),
    title="In-place LoRA reload at the same path serves stale prefix-cache blocks (vllm #42125)",
    tokens_only=True,
    engine_settings=(("enable_prefix_caching", True),),
)


@reload_path
class LoRAInPlaceSamePath(LoRAInPlace):
    name = "lora_inplace_same_path"
    exercises = (
        "lora_inplace the way RL trainers save adapters: every target written into one adapter directory, then "
        "add_lora(LoRARequest(same name, same id, that directory, load_inplace=True)), with prefix caching on "
        "(vLLM's default): name, id and path are unchanged, only the weights"
    )
    requirements = EngineRequirements(lora="adapter", enable_prefix_caching=True)
    known_issues = (VLLM_42125,)
    needs_cache_hits = True

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self._served: str | None = None

    def _write_at_the_served_path(self, source: str) -> str:
        if self._served is None:
            self._served = tempfile.mkdtemp(prefix="lora-served-", dir=scratch_root())
        shutil.rmtree(self._served)
        shutil.copytree(source, self._served)
        return self._served

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, load_inplace: bool = True) -> None:
        if self._served is None:  # segments start at A: from now on, A and every target live at one path
            engine.serve_adapter(self._write_at_the_served_path(self.checkpoints.a), load_inplace=True)
        engine.generate(self.prompts)  # the served path's KV blocks, computed with the adapter before the refit
        engine.serve_adapter(self._write_at_the_served_path(checkpoint_dir), load_inplace=load_inplace)

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, load_inplace=False)

    def close(self) -> None:
        if self._served:
            shutil.rmtree(self._served, ignore_errors=True)


@reload_path
class LoRABaseReload(ReloadWeightsFromDirectory):
    name = "lora_base_reload"
    exercises = (
        "reload_weights(weights_path=B) of the base weights while a LoRA engine serves adapter A "
        "(LoRA layers wrap every adapted linear): judged against a cold LoRA engine on base B serving A"
    )
    requirements = EngineRequirements(lora="base")
