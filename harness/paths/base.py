"""What a reload path is: the engine it needs and how it refits that engine.

Path classes are imported by the planner (for requirements, availability and
descriptions) and by the arm process (to refit). vLLM is imported only inside methods
that run in arms.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from harness.device import RunsOn, cuda_available
from harness.records import InFlightRequest, PromptOutput
from harness.settings import SCRATCH_ENV
from harness.spec.known_issues import KnownIssue, Refusal, Subject
from harness.spec.path_declaration import SabotageEvidence
from harness.spec.requirements import EngineRequirements, EngineRestart, RefitTarget
from harness.spec.run import PromptSpec

if TYPE_CHECKING:
    from harness.spec.checkpoint_set import CheckpointSet


def scratch_root() -> str | None:
    """Directory for a path's full weight copies: the arm's scratch directory under the run's
    out dir (set by the runner, swept after the arm and on start/resume); None outside a run."""
    root = os.environ.get(SCRATCH_ENV)
    if root:
        os.makedirs(root, exist_ok=True)
    return root or None


class Engine(Protocol):
    """What a path needs from a running engine. The arm's engines (``harness.arm.engines``)
    provide it; the paths own the interface so that they need not import the engine side."""

    def rpc(self, method: str | Callable[..., Any], kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``collective_rpc``: one result per worker rank. ``method``: a worker method's name, or
        (``llm`` and ``ray_llm`` engines) a module-level function ``f(worker, **kwargs)``, which
        vLLM pickles by reference and runs inside each worker."""
        ...

    def generate(self, prompts: PromptSpec) -> tuple[PromptOutput, ...]:
        """Greedy outputs for the fixed prompts."""
        ...

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A method of ``vllm.LLM`` (``sleep``, ``reset_prefix_cache``, weight-transfer calls...)."""
        ...

    def serve_adapter(self, directory: str, load_inplace: bool) -> None:
        """LoRA engines (``EngineRequirements.lora``) only: ``add_lora(LoRARequest(name, id,
        directory, load_inplace=...))`` under the engine's one adapter name and id; later
        requests serve it."""
        ...


class ReloadPath:
    """Base class: subclasses set the class attributes and implement ``refit``."""

    name: ClassVar[str]
    """Registry name."""
    exercises: ClassVar[str]
    """One line: which vLLM code path a refit through this path runs."""
    device: ClassVar[RunsOn] = "any"
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
    refusals: ClassVar[tuple[Refusal, ...]] = ()
    """Errors by which vLLM declines this refit by design on a device (SKIPPED with vLLM's words)."""
    sabotage: ClassVar[str] = (
        "the refit reads a copy of the target with the positive-control tensor left out, "
        "so that one tensor keeps its old value"
    )
    """What the path's sabotaged twin breaks: the one step the path exists for, skipped or
    broken. The twin must FAIL, or the path's own PASS proves nothing."""
    sabotage_targets: ClassVar[tuple[RefitTarget, ...]] = ("B", "A")
    """Refits of the sabotaged twin: the first is sabotaged; the others are real refits
    that leave the engine as the next segment expects."""
    sabotage_evidence: ClassVar[SabotageEvidence] = "tensor"
    """How a caught sabotage shows: ``tensor``, the left-out tensor (or its module's kernel)
    fails; ``tokens``, greedy tokens diverge from cold B (state no tensor census holds);
    ``drafter``, a tensor of the speculative-decoding drafter fails; ``encoder_cache``, images'
    embeddings served after the refit differ from cold B's."""
    needs_cache_hits: ClassVar[bool] = False
    """The path is meaningful only if the prefix cache served tokens after its refit."""
    needs_images: ClassVar[bool] = False
    """The path is about images (a vision-language model's encoder cache): it runs only where the
    prompts carry images, and is SKIPPED elsewhere."""
    needs_drafter: ClassVar[bool] = False
    """The path refits a speculative-decoding drafter: it runs only on an engine with one
    (``--draft-tokens``), and is SKIPPED elsewhere."""
    trains: ClassVar[bool] = False
    """A live trainer makes its targets: its refits are the trainer's optimizer steps, each
    judged on its own (``harness.paths.trainer_steps``)."""
    runs_last: ClassVar[bool] = False
    """vLLM may raise midway through this path's refit on some engines (a save vLLM cannot
    make): in a shared engine its segment and its twin run after every other path's segment
    and twin, so such a raise takes no other path's evidence with it."""

    def __init__(self, checkpoints: CheckpointSet, prompts: PromptSpec | None = None) -> None:
        self.checkpoints = checkpoints
        self.prompts = prompts

    @classmethod
    def unavailable_reason(cls, cuda: bool | None = None, packages: bool = True) -> str | None:
        """Why the path cannot run here (None: it can). ``cuda``: None asks this machine (the
        preflight asks for a GPU machine); ``packages``: also check optional packages."""
        if cuda_available() if cuda is None else cuda:
            return None
        if cls.cpu_skip_reason:
            return cls.cpu_skip_reason
        if cls.device == "cuda":
            return f"{cls.name} needs CUDA; no GPU on this machine (set HARNESS_DEVICE=gpu on a GPU host)"
        return None

    @classmethod
    def gpus_needed(cls, tensor_parallel_size: int) -> int:
        """GPUs its subject arm holds on CUDA (a weight-transfer trainer may need one more)."""
        return tensor_parallel_size

    @classmethod
    def known_issue(cls, subject: Subject) -> KnownIssue | None:
        """The known issue expected for a subject of this path (``Subject``: its recorded device,
        ``cpu (x86_64)`` or a GPU's name, vLLM version, model class, dtype, CPU capabilities and
        quantized kernels...): an architecture's or a kernel's issue (``harness.spec.known_issues``)
        first, then the path's own."""
        return next(iter(cls.known_issues_for(subject)), None)

    @classmethod
    def known_issues_for(cls, subject: Subject) -> tuple[KnownIssue, ...]:
        """Every known issue expected for such a subject, an architecture's or a kernel's first:
        a cell can hold two (Qwen3-MoE's experts and the fp32 oneDNN handles in a kernel-format
        reload)."""
        from harness.spec.known_issues import KNOWN_ISSUES

        # A "skip" issue never reaches the judge: its path was not started (SKIPPED).
        expected = [k for k in KNOWN_ISSUES if k.outcome == "xfail"]
        specific = [k for k in expected if k.architectures or k.kernels or k.quantization]
        general = list(cls.known_issues) + [k for k in expected if k not in specific]
        return tuple(k for k in specific + general if k.applies(cls.name, subject))

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> EngineRestart | None:
        """Update ``engine`` to ``target``; return an ``EngineRestart`` to be given a new engine."""
        raise NotImplementedError

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> EngineRestart | None:
        """The refit with the path's one essential step skipped or broken (see ``sabotage``)."""
        raise NotImplementedError(f"{self.name} declares no sabotaged refit")

    def take_in_flight(self) -> tuple[InFlightRequest, ...]:
        """Requests that were generating while the last refit ran, followed to their end (a
        path that refits a serving engine under ``/pause``); the arm stores them with the
        observation that follows. Asking again returns nothing until the next refit."""
        return ()

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
