"""What to run: frozen specs, no torch, no vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.builds import BuildSpec

Mode = Literal["eager", "compiled"]

# Fixed token-id prompts: no tokenizer is needed, so any checkpoint works offline.
DEFAULT_PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 17, 42, 99, 128, 7, 300, 12),
    (5, 5, 5, 5, 250, 251, 252, 253, 254, 255),
    (400, 3, 77, 21, 160, 88),
    (9, 480, 33, 2, 64, 310, 11, 45, 201, 130, 19),
)


@dataclass(frozen=True)
class EngineSpec:
    """Settings every engine arm of a run is built with."""

    dtype: str = "float32"
    """Model dtype passed to ``LLM(dtype=...)``."""
    mode: Mode = "eager"
    """``eager`` (``enforce_eager=True``) or ``compiled`` (torch.compile; CUDA graphs on GPU)."""
    tensor_parallel_size: int = 1
    """Ranks per engine."""
    kv_cache_memory_bytes: int = 64 << 20
    """KV cache size; small so that many arms fit on a laptop-sized machine."""
    max_model_len: int = 256
    """Longest sequence an arm serves."""
    max_num_seqs: int = 8
    """Batch size limit."""
    seed: int = 0
    """Engine seed."""
    enable_prefix_caching: bool = False
    """Off for the oracle: a refit must be judged on recomputed KV, not cached KV."""


@dataclass(frozen=True)
class PromptSpec:
    """The fixed prompts and how to decode them."""

    token_ids: tuple[tuple[int, ...], ...] = DEFAULT_PROMPTS
    """Token-id prompts; ids must be below the model's vocabulary size."""
    max_tokens: int = 12
    """Greedy tokens generated per prompt."""
    logprobs: int = 5
    """Top-k logprobs recorded per generated token."""


@dataclass(frozen=True)
class PerturbSpec:
    """How B is made from A when no ``--target`` is given."""

    name: str = "gaussian"
    """Registered perturbation (``harness.perturb.PERTURBATIONS``)."""
    seed: int = 1
    """Generator seed: the same seed makes the same B."""
    strength: float = 0.05
    """Relative size of the change."""


@dataclass(frozen=True)
class ControlSpec:
    """The positive control: B' is B with one checkpoint tensor scaled."""

    tensor: str = "model.layers.0.post_attention_layernorm.weight"
    """Checkpoint name of the tensor to scale. The default is read by a kernel as a
    tensor on every backend, so it shows up as a kernel input; a linear weight (e.g.
    ``...q_proj.weight``, packed into ``qkv_proj``) is seen through the kernel probes."""
    scale: float = 1.01
    """Factor applied to that tensor."""


@dataclass(frozen=True)
class JudgePolicy:
    """How differences become verdicts."""

    logprob_atol: float = 1.0e-4
    """Allowed |logprob difference| on top of the measured noise floor."""
    rebound: Literal["auto", "fail", "warn"] = "auto"
    """Whether a tensor whose storage moved across a refit fails the path. A moved
    address harms only code that captured the old one (CUDA graphs), so ``auto`` fails
    it when the engine runs compiled on a GPU and only reports it otherwise."""


@dataclass(frozen=True)
class KnownIssue:
    """A measured vLLM limitation a path runs into on one kind of device, like a strict
    pytest xfail: while the failure stays inside this scope the verdict is XFAIL (it does
    not fail the run); once it no longer reproduces the verdict is XPASS, which does."""

    device: Literal["cpu", "cuda"]
    """Where it applies (the arm's recorded device)."""
    reason: str
    """What goes wrong and why, as measured; shown with the verdict."""
    tensor_kinds: tuple[str, ...] = ()
    """Census kinds whose failing tensors it explains (``kernel`` for kernel probes). A
    failing tensor of another kind, or a failing kernel input, is a real FAIL."""
    error_contains: str | None = None
    """Text of the arm error it explains; any other error is a real ERROR."""


@dataclass(frozen=True)
class ThroughputSpec:
    """The optional generation-throughput probe (``--throughput``)."""

    batch: int = 8
    """Prompts generated at once (at most the engine's ``max_num_seqs``)."""
    output_len: int = 32
    """Greedy tokens per prompt."""
    repetitions: int = 3
    """Timed runs after one untimed warm-up; the report shows their median and spread."""


@dataclass(frozen=True)
class RunSpec:
    """One oracle run: checkpoints, paths and settings."""

    model: str
    """Directory of checkpoint A."""
    target: str | None = None
    """Directory of checkpoint B; None means A perturbed by ``perturb``."""
    paths: tuple[str, ...] = ("reload_weights",)
    """Registered reload paths to exercise (``harness.paths.PATHS``)."""
    engine: EngineSpec = field(default_factory=EngineSpec)
    """Engine settings shared by every arm."""
    prompts: PromptSpec = field(default_factory=PromptSpec)
    """Fixed prompts and decoding."""
    perturb: PerturbSpec = field(default_factory=PerturbSpec)
    """Recipe for B when no target is given."""
    control: ControlSpec = field(default_factory=ControlSpec)
    """The planted difference that must be detected."""
    judge: JudgePolicy = field(default_factory=JudgePolicy)
    """Tolerances and policies of the verdict."""
    arm_timeout_s: float = 900.0
    """An arm running longer than this is killed and marked ERROR."""
    build: BuildSpec | None = None
    """The Python environment (vLLM build) every arm runs under; None: the harness's own."""
    throughput: ThroughputSpec | None = None
    """Measure generation throughput on cold B and after each subject's first refit; None: off."""
