"""What to run: frozen specs, no torch, no vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.settings import DEFAULT_ARM_TIMEOUT_S
from harness.spec.build import BuildSpec
from harness.spec.engine_config import RELOAD_MODE_ENV, RELOAD_MODES, DrafterMethod, EngineArgs, ReloadMode, decode

Mode = Literal["eager", "compiled"]
DigestChoice = Literal["auto", "xxh3", "blake3", "device"]
"""How arms digest tensors (``--digest``). ``xxh3``: xxh3-128 over 4 MiB leaves, at memory
speed; ``blake3``: blake3-128 (the digest before issue 24); ``device``: an exact reduction over
the raw bytes on the tensor's own device, no host copy (``harness.worker.device_digest``);
``auto``: ``device`` in an arm with CUDA, ``xxh3`` otherwise. One arm digests every tensor
with one algorithm, recorded in its environment; digests of different algorithms are never
compared (``harness.judge.diff.one_digest``)."""


@dataclass(frozen=True)
class EngineSpec:
    """Settings every engine arm of a run is built with."""

    dtype: str = "float32"
    """Model dtype passed to ``LLM(dtype=...)``."""
    mode: Mode = "eager"
    """``eager`` (``enforce_eager=True``) or ``compiled`` (torch.compile; CUDA graphs on GPU)."""
    tensor_parallel_size: int = 1
    """Ranks per engine."""
    kv_cache_memory_bytes: int | None = 64 << 20
    """KV cache size; small so that many arms fit on a laptop-sized machine. None: sized from
    the model's config when the run is prepared, for ``max_num_seqs`` sequences of
    ``max_model_len`` with a margin (``harness.spec.kv_cache``), as a real model needs."""
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
    cpu_isa: str = "native"
    """The CPU capability level vLLM is made to see (``--cpu-isa``): ``native``, or ``avx512_bf16``,
    ``avx512``, ``avx2`` to take a smaller CPU's kernel branches on this one (``harness.cpu_isa``).
    Part of every arm's plan, so of the arm and reference keys."""
    reload_mode: ReloadMode = "layerwise"
    """vLLM's reload mode for every arm (``--reload-mode``; set as ``VLLM_RELOAD_MODE`` in every
    vLLM process the arm starts). Part of every arm's plan, so of the arm and reference keys, and
    a scope of known issues."""
    draft_tokens: int = 0
    """Speculative decoding with a drafter (``--draft-tokens``): every arm's engine proposes this
    many tokens per step with a ``draft_model`` drafter loaded from the arm's own checkpoint (the
    target drafts for itself, so a cold engine accepts every draft), and the census and the
    observations cover the drafter. 0: no drafter."""
    drafter: DrafterMethod = "draft_model"
    """The drafter's kind (``--drafter``): ``draft_model`` as above, ``eagle``, an EAGLE head
    the harness derives from each arm's checkpoint (``harness.checkpoints.eagle``: a cold B drafts
    with B's head), or ``mtp``, the checkpoint's own multi-token-prediction layers. Only with
    ``draft_tokens``."""
    engine_args: EngineArgs = ()
    """Further vLLM engine arguments every arm is built with (``--engine-arg``, ``--engine-config``,
    a scenario's engine configuration), as sorted ``(EngineArgs field, JSON value)`` pairs.
    They override the harness's defaults above (``max_num_seqs``, ``enable_prefix_caching``...);
    a reload path's own needs (its load format, prefix caching, sleep mode) still win. Checked
    against the build's ``EngineArgs`` before any engine starts (``harness.spec.engine_config``)."""

    def vllm_kwargs(self) -> dict:
        """The engine arguments as ``LLM(...)`` keyword arguments."""
        return decode(self.engine_args)

    def reload_env(self) -> dict[str, str]:
        """The variables that give an arm's vLLM processes this reload mode; none for vLLM's
        default, so that a vLLM without the variable never sees it."""
        return {} if self.reload_mode == RELOAD_MODES[0] else {RELOAD_MODE_ENV: self.reload_mode}

    def setting(self, name: str):
        """The value an arm runs with for one of the harness's own settings above, after the
        engine arguments (``max_model_len`` given as ``--engine-arg`` wins over the default)."""
        return self.vllm_kwargs().get(name, getattr(self, name))


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
    images: tuple[int, ...] | None = None
    """For a model that takes images: the seed of each prompt's generated image (its pixels drawn
    from it, ``harness.arm.images``), whose placeholder token is in its ``token_ids``; None: text
    prompts."""
    max_tokens: int = 12
    """Greedy tokens generated per prompt."""
    logprobs: int = 5
    """Top-k logprobs recorded per generated token."""


@dataclass(frozen=True)
class PerturbSpec:
    """How B is made from A when no ``--target`` is given."""

    name: str = "gaussian"
    """Registered perturbation (``harness.checkpoints.perturb.PERTURBATIONS``)."""
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
    before any engine starts (``harness.judge.accuracy.read_accuracy_file``)."""

    file: str
    """The JSONL file the items came from (shown in reports)."""
    prompts: tuple[str, ...]
    """Prompt texts, in file order; tokenized inside the arms, never here."""
    answers: tuple[str, ...]
    """The known answer of each prompt; used only to judge, from records (arms never see them)."""
    max_tokens: int = 16
    """Greedy tokens generated per prompt."""
    damage: float = 1.0
    """Strength of the seeded gaussian damage (``harness.checkpoints.perturb.gaussian``) of the damaged copy of B
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
class TrainerSpec:
    """The live trainer of the trainer paths: a transformers model of checkpoint A in fp32,
    trained with AdamW on the next-token loss over the run's prompts. Each optimizer step's
    weights are one oracle target (``T<k>``), judged against a cold start on that step's
    ``save_pretrained``."""

    steps: int = 2
    """Optimizer steps, one verdict each."""
    lr: float = 5.0e-3
    """AdamW learning rate: large enough that every tensor still moves after a cast to bf16
    (Adam moves each element by about ``lr`` a step; bf16 spaces values near 1 by 2**-7)."""
    threads: int = 1
    """CPU threads of every trainer step: a step's result depends on the thread count (the
    reductions of the backward pass split by threads), and the prepared steps and the live
    trainer must compute the same weights."""
    seed: int = 0
    """``torch.manual_seed`` before the trainer is built."""


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
    arm_timeout_s: float = DEFAULT_ARM_TIMEOUT_S
    """An arm running longer than this is killed and marked ERROR."""
    trainer: TrainerSpec = field(default_factory=TrainerSpec)
    """The live trainer of the trainer paths (``trainer_steps``, ``trainer_steps_gloo``)."""
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
    digest: DigestChoice = "auto"
    """How every arm digests tensors (``DigestChoice``); part of the reference-cache key."""
    requires_device: tuple[str, ...] = ()
    """Devices the engine configuration runs on at all, any of them: ``cpu``, ``cuda`` or a
    compute capability such as ``sm90`` (``harness.device.device_tags``); elsewhere every path is
    SKIPPED with ``requires_reason``. Empty: anywhere."""
    requires_reason: str = ""
    """Why the configuration needs that device (shown in the SKIPPED reason)."""
    requires_packages: tuple[tuple[str, str], ...] = ()
    """``(module, why and how to install it)`` of the modules the engine configuration imports
    (``EngineConfig.packages``); where one is missing every path is SKIPPED with that text."""
    expected_census: tuple[str, ...] = ()
    """Regular expressions (searched) of census names the cold-B reference must observe: the
    state the engine configuration's kernels read (a scenario's ``EngineConfig.expect_census``).
    One never observed makes a PASS INCONCLUSIVE, naming it."""
    lora: str | None = None
    """PEFT adapter directory A served by LoRA paths' engines; None: the harness writes a
    deterministic adapter for the model (only when a LoRA path runs)."""
    lora_target: str | None = None
    """PEFT adapter directory B of the ``lora_inplace`` refit; None: A perturbed in every tensor."""
