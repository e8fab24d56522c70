"""What a reload path is: the engine it needs and how it refits that engine.

Path classes are imported by the planner (for requirements, availability and
descriptions) and by the arm process (to refit). vLLM is imported only inside methods
that run in arms.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from harness.spec import KnownIssue, Mode, PromptSpec

if TYPE_CHECKING:
    from harness.checkpoints import CheckpointSet
    from harness.engine.engines import Engine

EngineKind = Literal["llm", "ray_llm", "http"]
RefitTarget = Literal["A", "B", "B_control"]


def scratch_root() -> str | None:
    """Directory for a path's full weight copies: the arm's scratch directory under the run's
    out dir (set by the runner, swept after the arm and on start/resume); None outside a run."""
    root = os.environ.get("REFIT_HARNESS_SCRATCH")
    if root:
        os.makedirs(root, exist_ok=True)
    return root or None


def cuda_available() -> bool:
    """Planner-side test for CUDA, without importing torch or vLLM."""
    return os.environ.get("HARNESS_DEVICE") == "gpu" or shutil.which("nvidia-smi") is not None


@dataclass(frozen=True)
class EngineRequirements:
    """How the subject engine of a path must be built. Paths with equal requirements
    share one engine, one segment after another, so cold starts do not grow with paths."""

    kind: EngineKind = "llm"
    """``llm``: ``vllm.LLM`` in the arm process; ``ray_llm``: ``LLM`` inside a Ray actor (as
    RL frameworks run it, so a Ray trainer can drive it); ``http``: a real ``vllm serve``."""
    load_format: str = "auto"
    """``LLM(load_format=...)`` for the cold start (``dummy`` starts from random weights)."""
    enable_prefix_caching: bool | None = None
    """Override the run's prefix-caching setting."""
    weight_transfer_backend: str | None = None
    """Build the engine with ``WeightTransferConfig(backend=...)``."""
    mode: Mode | None = None
    """Override the run's eager/compiled mode."""
    enable_sleep_mode: bool = False
    """Build the engine with ``enable_sleep_mode=True``."""
    restarts: bool = False
    """The path ends the engine and starts a new one at every refit: it cannot share an
    engine, and addresses or hook counts are not comparable across its refits."""


@dataclass(frozen=True)
class EngineRestart:
    """What a refit returns when it replaces the engine: the arm closes the old engine
    and cold-starts a new one from ``model`` with ``load_format``."""

    model: str
    """Directory the new engine starts from."""
    load_format: str
    """``LLM(load_format=...)`` of the new engine."""


class ReloadPath:
    """Base class: subclasses set the class attributes and implement ``refit``."""

    name: ClassVar[str]
    """Registry name."""
    exercises: ClassVar[str]
    """One line: which vLLM code path a refit through this path runs."""
    device: ClassVar[Literal["any", "cuda"]] = "any"
    """Where it can run."""
    requirements: ClassVar[EngineRequirements] = EngineRequirements()
    """The subject engine this path needs."""
    refit_targets: ClassVar[tuple[RefitTarget, ...]] = ("B", "B", "B_control", "A")
    """Refits of one segment, in order: B (warm_B), B again (idempotency), B' (positive
    control), back to A (round trip; it also leaves the engine at A for the next path)."""
    cpu_skip_reason: ClassVar[str | None] = None
    """Why the path cannot be judged on a CPU-only machine, when that is not just CUDA."""
    known_issues: ClassVar[tuple[KnownIssue, ...]] = ()
    """Measured vLLM limitations this path runs into, per device (XFAIL while they hold)."""
    sabotage: ClassVar[str] = ("the refit reads a copy of the target with the positive-control tensor left out, "
                               "so that one tensor keeps its old value")
    """What the path's sabotaged twin breaks: the one step the path exists for, skipped or
    broken. The twin must FAIL, or the path's own PASS proves nothing."""
    sabotage_targets: ClassVar[tuple[RefitTarget, ...]] = ("B", "A")
    """Refits of the sabotaged twin: the first is sabotaged; the others are real refits
    that leave the engine as the next segment expects."""
    sabotage_evidence: ClassVar[Literal["tensor", "tokens"]] = "tensor"
    """How a caught sabotage shows: ``tensor``, the left-out tensor (or its module's kernel)
    fails; ``tokens``, greedy tokens diverge from cold B (state no tensor census holds)."""
    needs_cache_hits: ClassVar[bool] = False
    """The path is meaningful only if the prefix cache served tokens after its refit."""

    def __init__(self, checkpoints: CheckpointSet, prompts: PromptSpec | None = None) -> None:
        self.checkpoints = checkpoints
        self.prompts = prompts

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if cuda_available():
            return None
        if cls.cpu_skip_reason:
            return cls.cpu_skip_reason
        if cls.device == "cuda":
            return f"{cls.name} needs CUDA; no GPU on this machine (set HARNESS_DEVICE=gpu on a GPU host)"
        return None

    @classmethod
    def known_issue(cls, device: str, vllm_version: str | None = None,
                    architecture: str | None = None) -> KnownIssue | None:
        """The known issue expected for a subject of this path on an arm's recorded device
        (``cpu (x86_64)``, a GPU's name...), vLLM version and model class: an architecture's
        issue (``harness.known_issues``) first, then the path's own."""
        from harness.known_issues import KNOWN_ISSUES

        specific = [k for k in KNOWN_ISSUES if k.architectures]
        general = list(cls.known_issues) + [k for k in KNOWN_ISSUES if not k.architectures]
        return next((k for k in specific + general if k.applies(cls.name, device, vllm_version, architecture)), None)

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> EngineRestart | None:
        """Update ``engine`` to ``target``; return an ``EngineRestart`` to be given a new engine."""
        raise NotImplementedError

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> EngineRestart | None:
        """The refit with the path's one essential step skipped or broken (see ``sabotage``)."""
        raise NotImplementedError(f"{self.name} declares no sabotaged refit")

    @property
    def left_out(self) -> str:
        """The checkpoint tensor a sabotaged refit leaves where it was."""
        return self.checkpoints.control_tensor

    def without_left_out(self, target: RefitTarget) -> str:
        """The target's checkpoint directory with ``left_out`` missing."""
        if target != "B" or not self.checkpoints.b_without_control:
            raise ValueError(f"no sabotaged copy of checkpoint {target} was prepared (run with sabotage on)")
        return self.checkpoints.b_without_control

    def close(self) -> None:
        """Release what earlier refits set up; called even when a step failed."""
