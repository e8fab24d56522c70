"""What to run: frozen specs, no torch, no vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.builds import BuildSpec

Mode = Literal["eager", "compiled"]

# Default prompts share a prefix longer than two KV blocks (vLLM's CPU backend uses
# 128-token blocks), so a prefix cache has whole blocks to serve after a refit.
SHARED_PREFIX_TOKENS = 272
PROMPT_SUFFIX_TOKENS = (8, 10, 6, 11)


# Text prompts for a checkpoint with a tokenizer: a shared passage (repeated until it covers
# SHARED_PREFIX_TOKENS tokens, where it is cut) and a distinct question each.
PROMPT_PASSAGE = ("In reinforcement learning from human feedback, an inference engine generates samples "
                  "while a trainer updates the policy weights. After every update the new weights are "
                  "copied into the running engine, which must then compute exactly what a freshly "
                  "loaded engine with the same weights would compute. ")
PROMPT_QUESTIONS = ("Question: what must the engine compute after an update? Answer:",
                    "Question: who updates the policy weights? Answer:",
                    "Summarize the passage in one sentence:",
                    "Question: where are the new weights copied to, and when? Answer:")


def text_prompts(encode, vocab_size: int) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] | None:
    """``(token_ids, texts)`` of the text prompts, encoded with a checkpoint's own tokenizer
    (``encode``: text -> ids); None if its ids do not fit the model's vocabulary."""
    passage = PROMPT_PASSAGE
    while len(encode(passage)) < SHARED_PREFIX_TOKENS:
        passage += PROMPT_PASSAGE
    prefix = tuple(encode(passage)[:SHARED_PREFIX_TOKENS])
    ids = tuple(prefix + tuple(encode(" " + q)) for q in PROMPT_QUESTIONS)
    if any(not 0 <= t < vocab_size for p in ids for t in p):
        return None
    return ids, tuple(passage + " " + q for q in PROMPT_QUESTIONS)


def shared_prefix_prompts(vocab_size: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """Token-id prompts for any checkpoint, offline: a shared prefix and a distinct suffix
    each, drawn deterministically from ``[1, vocab_size)`` (id 0 is often padding)."""
    import random

    if vocab_size < 2:
        raise ValueError(f"vocabulary of {vocab_size} token(s) is too small for prompts")
    draw = random.Random(seed)
    prefix = tuple(draw.randrange(1, vocab_size) for _ in range(SHARED_PREFIX_TOKENS))
    return tuple(prefix + tuple(draw.randrange(1, vocab_size) for _ in range(n)) for n in PROMPT_SUFFIX_TOKENS)


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
    max_model_len: int = 512
    """Longest sequence an arm serves (the default prompts are ~280 tokens)."""
    max_num_seqs: int = 8
    """Batch size limit."""
    seed: int = 0
    """Engine seed."""
    enable_prefix_caching: bool = False
    """Off for the oracle: a refit must be judged on recomputed KV, not cached KV."""
    engine_core_process: bool = False
    """Run vLLM's engine core in a process of its own (vLLM's default), instead of inside the
    arm (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). The model, its weights and every refit run in
    the same worker code either way; in-process saves a second vLLM import and start per arm
    (measured here: 45 s vs 18 s for a tiny model's cold start). ``vllm serve`` arms always
    keep vLLM's own process layout."""


@dataclass(frozen=True)
class PromptSpec:
    """The fixed prompts and how to decode them."""

    token_ids: tuple[tuple[int, ...], ...] | None = None
    """Token-id prompts; ids must be below the model's vocabulary size. None: made when the
    run is prepared, from text with the checkpoint's own tokenizer (``text_prompts``) or,
    without one, drawn from the model's vocabulary (``shared_prefix_prompts``)."""
    texts: tuple[str, ...] | None = None
    """The text each prompt was tokenized from (the tokenizer's prefix cut may end mid-passage);
    None for prompts given or drawn as token ids."""
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

    tensor: str | None = None
    """Checkpoint name of the tensor to scale; None chooses one from the checkpoint's
    headers (``checkpoints.choose_control_tensor``: an early-layer norm weight, which a
    kernel reads as a tensor on every backend, so it shows up as a kernel input). A
    linear weight (e.g. ``...q_proj.weight``, packed into ``qkv_proj``) is seen through
    the kernel probes."""
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
    """A measured vLLM limitation, like a strict pytest xfail: while the failure stays inside
    this scope the verdict is XFAIL (it does not fail the run); once it no longer reproduces
    the verdict is XPASS, which does. Scoped per device, and optionally per vLLM version,
    architecture and path, so a fix upstream shows up as XPASS on the version that has it."""

    device: Literal["cpu", "cuda"]
    """Where it applies (the arm's recorded device)."""
    reason: str
    """What goes wrong and why, as measured; shown with the verdict."""
    tensor_kinds: tuple[str, ...] = ()
    """Census kinds whose failing tensors it explains (``kernel`` for kernel probes). A
    failing tensor of another kind, or a failing kernel input, is a real FAIL."""
    error_contains: str | None = None
    """Text of the arm error it explains; any other error is a real ERROR."""
    vllm: tuple[str, ...] = ()
    """PEP 440 specifier sets of the vLLM versions it was measured on, any of which
    matches, e.g. ``("==0.31.*", "==0.32.*")`` (empty: every version). On another version
    nothing is expected: a failure there is a real FAIL."""
    architectures: tuple[str, ...] = ()
    """vLLM model classes it applies to, e.g. ``Qwen3MoeForCausalLM`` (empty: every one)."""
    paths: tuple[str, ...] = ()
    """Reload paths it applies to, for issues declared in ``harness.known_issues`` (a path
    class's own issues apply to that path)."""
    tensor_pattern: str | None = None
    """Regular expression every failing tensor and kernel input name must match (searched),
    on top of ``tensor_kinds``; None: any name of those kinds."""
    title: str = ""
    """One line naming the bug, ready to be an upstream issue title."""
    dtypes: tuple[str, ...] = ()
    """Model dtypes it was measured in (empty: every dtype); e.g. the CPU oneDNN handles
    exist for float32 weights only."""

    def applies(self, path: str, device: str, vllm_version: str | None, architecture: str | None,
                dtype: str | None = None) -> bool:
        """Whether this issue is expected for a subject that ran ``path`` on ``device``
        (``cpu ...`` or a GPU name) with this vLLM version, model class and dtype."""
        if self.device != ("cpu" if device.startswith("cpu") else "cuda"):
            return False
        if self.paths and path not in self.paths:
            return False
        if self.dtypes and dtype not in self.dtypes:
            return False
        if self.architectures and architecture not in self.architectures:
            return False
        if self.vllm:
            from packaging.specifiers import SpecifierSet
            from packaging.version import InvalidVersion, Version

            try:
                version = Version(vllm_version.split("+")[0]) if vllm_version else None
            except InvalidVersion:
                return False
            return version is not None and any(version in SpecifierSet(spec) for spec in self.vllm)
        return True


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
class AccuracySpec:
    """The optional exact-match accuracy probe (``--accuracy FILE.jsonl``), read and checked
    before any engine starts (``harness.accuracy.read_accuracy_file``)."""

    file: str
    """The JSONL file the items came from (shown in reports)."""
    prompts: tuple[str, ...]
    """Prompt texts, in file order; tokenized inside the arms, never here."""
    answers: tuple[str, ...]
    """The known answer of each prompt; used only to judge, from records (arms never see them)."""
    max_tokens: int = 16
    """Greedy tokens generated per prompt."""
    damage: float = 1.0
    """Strength of the seeded gaussian damage (``harness.perturb.gaussian``) of the damaged copy of B
    the discriminating-power arm cold-starts on: 1.0 adds noise as large as each tensor's spread."""


@dataclass(frozen=True)
class AccuracyPrompts:
    """What an arm needs to run the accuracy probe: the prompts, not the answers, so that
    records (and the reference cache key) depend only on what the engine was given."""

    prompts: tuple[str, ...]
    """Prompt texts (``AccuracySpec.prompts``)."""
    max_tokens: int
    """Greedy tokens generated per prompt."""


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
    sabotage: bool = False
    """Also run each path's sabotaged twin (the one step the path exists for, skipped or
    broken) in the same engine. A twin that is not caught makes the path INCONCLUSIVE."""
    build: BuildSpec | None = None
    """The Python environment (vLLM build) every arm runs under; None: the harness's own."""
    throughput: ThroughputSpec | None = None
    """Measure generation throughput on cold B and after each subject's first refit; None: off."""
    accuracy: AccuracySpec | None = None
    """Exact-match accuracy on cold B, after each subject's first refit to B, and on a damaged
    copy of B (the eval's discriminating power); None: off."""
