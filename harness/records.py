"""Observation records: what an engine arm saw, as plain frozen values.

Everything after observation (compare, judge, report) works from these records,
read back from disk on a machine without vLLM or torch. Each file written carries
``schema_version`` (see ``harness.store``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TensorKind = Literal["parameter", "buffer", "attribute", "object", "closure", "kernel", "number"]
ArmRole = Literal[
    "reference",
    "noise",
    "mode_reference",
    "shape_reference",
    "lora_reference",
    "lora_noise",
    "trainer_reference",
    "subject",
    "damaged",
]
ArmStatus = Literal["ok", "error"]

DRAFTER_PREFIX = "drafter."
"""Census names of a speculative-decoding drafter's tensors: ``drafter.`` + the name in the
drafter's own model (``model_runner.drafter.model``), beside the target's."""


@dataclass(frozen=True)
class TensorRecord:
    """One tensor reachable from the model, as seen at one moment on one rank."""

    name: str
    """Dotted path from the model root, e.g. ``model.layers.0.self_attn.q_norm.weight``."""
    kind: TensorKind
    """How it was reached: registered parameter/buffer, plain attribute, an attribute
    of a non-module object (quant method, kernel object), a closure/partial, or
    ``kernel``: the output of a linear kernel on a fixed probe input (for weights held
    in opaque kernel handles); its address is meaningless. ``number``: a Python float or int
    attribute (``_k_scale_float``, taken from a tensor at load), judged like a tensor: its
    digest is of its exact value, its dtype ``float`` or ``int``, its shape ``()``."""
    dtype: str
    """torch dtype name, e.g. ``float32``."""
    shape: tuple[int, ...]
    """Tensor shape."""
    device: str
    """Device string, e.g. ``cpu`` or ``cuda:0``."""
    address: int
    """``data_ptr()`` at observation time; a change across a refit means the tensor was rebound."""
    digest: str
    """Exact digest of the bytes in row-major order (layout-independent), with the arm's
    algorithm (``ArmResult.environment['digest']``, see ``harness.worker.digest``); compared only
    with digests of the same algorithm (``harness.judge.diff.one_digest``)."""
    nan_count: int
    """Number of NaN elements (0 for non-float dtypes)."""
    absmax: float
    """Largest absolute value (0.0 for empty tensors); a readable hint, not used for judging."""
    rank: int = 0
    """Worker rank that holds it (see ``Observation.shown_name``)."""
    value: float | int | None = None
    """The number itself, for a ``number`` (shown beside a STALE or CORRUPT one); None for tensors."""


@dataclass(frozen=True)
class UnobservedRecord:
    """A tensor, kernel or forward the census reached but could not observe. It is
    counted and shown in the report, never judged, and the rest of the observation goes on."""

    name: str
    """Census name it would have had, e.g. ``backbone.layers.0.mixer.in_proj.<kernel-output>``,
    or ``<kernel-inputs>`` when the recorded forward itself could not be taken."""
    kind: str
    """Census kind it would have had (``kernel`` for a kernel probe), or ``forward``."""
    reason: str
    """Why it could not be observed: the exception vLLM or torch raised, shortened."""
    rank: int | None = None
    """Worker rank that reached it; None for what the arm itself could not observe (its
    recorded forward), which belongs to no one rank."""


@dataclass(frozen=True)
class PromptOutput:
    """Greedy continuation of one fixed prompt."""

    prompt: int
    """Index of the prompt in the spec's prompt list."""
    token_ids: tuple[int, ...]
    """Generated token ids."""
    logprobs: tuple[tuple[tuple[int, float], ...], ...]
    """Per generated position, the top-k ``(token_id, logprob)`` pairs, best first."""
    cached_tokens: int | None = None
    """Prompt tokens served from the prefix cache (vLLM's ``num_cached_tokens``); None
    where the engine does not say."""
    text: str | None = None
    """The generated tokens decoded with the checkpoint's own tokenizer (text prompts only)."""


@dataclass(frozen=True)
class EncoderCacheEntry:
    """One image's embeddings in the engine's encoder cache (vLLM keeps each encoder output,
    keyed by the image's content hash, and serves it to any later request with that image)."""

    mm_hash: str
    """vLLM's hash of the image."""
    digest: str
    """Digest of the cached embeddings (the census's algorithm)."""


@dataclass(frozen=True)
class InFlightRequest:
    """A streaming request that was generating when a refit paused the engine
    (``/pause?mode=keep`` ... ``/resume``), followed to its end."""

    prompt: int
    """Index of the prompt in the spec's prompt list."""
    tokens_before_pause: tuple[int, ...]
    """Tokens streamed before ``/pause`` answered (computed with the old weights)."""
    tokens_while_paused: int
    """Tokens streamed between ``/pause`` answering and ``/resume`` (``keep`` promises none)."""
    tokens_after_resume: tuple[int, ...]
    """Tokens streamed after ``/resume`` (the rest of the request)."""
    finish_reason: str | None
    """How the request ended (``length``: it ran to its token budget); None if it never ended."""
    error: str | None
    """What went wrong with the request (an HTTP error, a broken stream), or None."""
    fresh_divergence: int | None
    """First index where ``tokens_after_resume`` differs from a fresh request on the prompt plus
    ``tokens_before_pause``, sent after the resume (the new weights computing the same prefix
    from scratch); None: identical."""
    fresh_max_logprob_diff: float
    """Largest |logprob difference| of the chosen tokens against that fresh request, up to the
    first divergence (0.0: the resumed request computed exactly what the new weights compute)."""
    pause_mode: str = "keep"
    """How ``/pause`` treated it: ``keep``, frozen across the refit and resumed after it;
    ``wait``, a gated refit (``/pause?mode=wait``): drained to its end before the refit, or sent
    while paused and run after the resume, so it must be entirely A's or entirely B's."""
    rank: int | None = None
    """The data-parallel rank it was pinned to (``X-data-parallel-rank``); None: not pinned."""


@dataclass(frozen=True)
class ConsumedTensor:
    """A tensor that existed before a forward and that an op read during it."""

    name: str
    """Census name, or ``unregistered@<module>:<op>#<arg>`` when nothing registers it."""
    op_index: int
    """Position of the op in the forward's op sequence."""
    op: str
    """Op name, e.g. ``aten.mul.Tensor`` or a custom op."""
    arg: int
    """Position of the tensor among the op's flattened arguments."""
    module: str
    """Module whose forward was running when the op ran."""
    dtype: str
    """torch dtype name."""
    shape: tuple[int, ...]
    """Tensor shape."""
    address: int
    """``data_ptr()`` when read."""
    digest: str
    """Exact digest of the bytes read, as ``TensorRecord.digest``."""
    nan_count: int = 0
    """NaN elements read (a NaN counts as a difference, as for census tensors)."""
    rank: int = 0
    """Worker rank whose forward read it."""


@dataclass(frozen=True)
class HookRecord:
    """A post-load hook found on the live model, with how often it has run."""

    module: str
    """Module path (``<model>`` for the model itself)."""
    kind: Literal["quant_method", "module", "model"]
    """``quant_method.process_weights_after_loading``, a module's own hook (attention), or the model-level hook."""
    calls: int
    """Calls since the harness started watching (after the cold start's hooks had run)."""
    owner: str = ""
    """Class the hook belongs to: the quant method's (``UnquantizedLinearMethod``) or the
    module's (``Attention``, the model class); empty in records from older harnesses."""


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model needed to interpret tensor names."""

    architecture: str
    """Class name of the model vLLM instantiated."""
    packed_modules_mapping: tuple[tuple[str, tuple[str, ...]], ...]
    """vLLM's ``packed_modules_mapping``: fused module -> checkpoint modules it packs
    (``qkv_proj`` <- ``q_proj, k_proj, v_proj``); used to localize the positive control."""
    world_size: int
    """Number of ranks observed."""
    weight_names: tuple[tuple[str, str], ...] = ()
    """Checkpoint name -> the model's own name, for the checkpoint names the comparison
    needs (the control tensor) that vLLM's weights mapper renames (``backbone.`` ->
    ``model.`` on NemotronH); names it keeps are absent. Older records: none."""
    quant_kernels: tuple[str, ...] = ()
    """The quantized linear kernels the model runs (``census.quant_kernels``), e.g.
    ``CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_onednn``: known
    issues of one kernel path are scoped on them. Unquantized models and older records: none."""


@dataclass(frozen=True)
class ObservationLabel:
    """A point of an arm's life where the engine is observed; ``str()`` gives the form
    reports show, ``<path>/<stage>`` in a segment, ``<stage>`` before any."""

    stage: str
    """``cold_<start>`` (``cold_A``, ``cold_B``, ``cold_dummy``, ``cold_B_damaged``) at the cold
    start; in a segment, after its refits: ``warm_B``, ``warm_B_again``, ``warm_B_control``, ``warm_A``."""
    path: str | None = None
    """The segment it belongs to: a reload path, or its sabotaged twin ``<path>~sabotage``
    (``harness.plan.sabotaged_twin``); None at the cold start."""

    def __str__(self) -> str:
        return self.stage if self.path is None else f"{self.path}/{self.stage}"


@dataclass(frozen=True)
class ProbeLabel:
    """A throughput or accuracy probe, taken right after an observation point."""

    probe: Literal["throughput", "accuracy"]
    """Which probe."""
    after: ObservationLabel
    """The point it follows: a cold start (``cold_B``, ``cold_B_damaged``) or a path's ``warm_B``."""

    @property
    def point(self) -> str:
        """What reports group it under: the path, or the cold stage (``cold_B``)."""
        return self.after.stage if self.after.path is None else self.after.path

    def __str__(self) -> str:
        return f"{self.point}/{self.probe}"


@dataclass(frozen=True)
class Observation:
    """Everything observed at one labelled point of an arm's life."""

    label: ObservationLabel
    """Point in the arm's life."""
    tensors: tuple[TensorRecord, ...]
    """Census of every tensor reachable from the model, all ranks."""
    outputs: tuple[PromptOutput, ...]
    """Greedy outputs for the fixed prompts, taken after the census."""
    model: ModelInfo
    """Facts about the model at this point."""
    consumed: tuple[ConsumedTensor, ...] = ()
    """Persistent tensors the kernels read during one recorded forward, in op order."""
    hooks: tuple[HookRecord, ...] = ()
    """Post-load hooks on the model and their call counts so far."""
    unobserved: tuple[UnobservedRecord, ...] = ()
    """What the census could not observe on any rank, with the reason (older records: none)."""
    graph_reads: tuple[GraphRead, ...] = ()
    """Under CUDA graphs: for each tensor whose storage moved across the refit before this
    observation, whether a captured graph still reads its old storage (older records: none)."""
    graphs_probed: bool = False
    """Whether the graph-read probe ran for this observation (an engine with captured graphs)."""
    in_flight: tuple[InFlightRequest, ...] = ()
    """Requests that were generating while the refit before this observation ran, followed to
    their end (paths that refit a serving engine under ``/pause``; others: none)."""
    drafts: tuple[int, int] | None = None
    """``(accepted, proposed)`` draft tokens of a speculative-decoding engine over the greedy
    requests of this observation (vLLM's ``spec_decode`` counters); None: no drafter, or an
    engine that does not report them."""

    encoder_cache: tuple[EncoderCacheEntry, ...] | None = None
    """The engine's encoder cache after this observation's greedy requests (rank 0); None: a
    model that takes no images, or an engine without one."""
    encoder_cache_kept: int | None = None
    """Encoder-cache entries the engine held when this observation began, before any request of
    it: after a refit, embeddings computed before the refit, still servable. None: as above."""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed draft tokens; None without drafts."""
        if self.drafts is None or not self.drafts[1]:
            return None
        return self.drafts[0] / self.drafts[1]

    def shown_name(self, record: TensorRecord | ConsumedTensor | UnobservedRecord | GraphRead) -> str:
        """A record's name as comparisons and reports show it: ``rank<N>:<name>`` when more
        than one rank was observed, the bare name otherwise."""
        return (
            f"rank{record.rank}:{record.name}" if self.model.world_size > 1 and record.rank is not None else record.name
        )


GraphReadStatus = Literal["read", "unread", "unchecked"]


@dataclass(frozen=True)
class GraphRead:
    """Whether captured CUDA graphs still read a tensor at the storage it had before a refit.

    A captured graph replays the addresses it was captured with, so a tensor the refit gave new
    storage is read at the old one until the graph is captured again; a dispatch-mode
    recording cannot see this (a replay dispatches no op). ``harness.worker.graph_reads``."""

    name: str
    """The tensor's census name."""
    rank: int
    """Worker rank."""
    status: GraphReadStatus
    """``read``: its old address is a captured graph's input, or poisoning its old storage
    changed what the engine generated inside the captured batch sizes; ``unread``: neither;
    ``unchecked``: it could not be shown either way (then it counts as read)."""
    evidence: str
    """What showed it, in one line."""


@dataclass(frozen=True)
class RankCensus:
    """What one worker rank answers to the census call (built in the worker, sent as JSON)."""

    rank: int
    """The worker's rank."""
    tensors: tuple[TensorRecord, ...]
    """Its census, every record carrying ``rank``."""
    unobserved: tuple[UnobservedRecord, ...]
    """What it reached and could not observe."""
    architecture: str
    """Class name of the model vLLM instantiated."""
    packed_modules_mapping: tuple[tuple[str, tuple[str, ...]], ...]
    """vLLM's ``packed_modules_mapping``, sorted (see ``ModelInfo``)."""
    hooks: tuple[HookRecord, ...]
    """Post-load hooks and their call counts on this rank."""
    weight_names: tuple[tuple[str, str], ...]
    """Checkpoint name -> the model's own name, where vLLM renames it (see ``ModelInfo``)."""
    quant_kernels: tuple[str, ...] = ()
    """The quantized linear kernels it runs (see ``ModelInfo``)."""


@dataclass(frozen=True)
class RankRecording:
    """What one worker rank answers when its kernel-input recorder is stopped."""

    rank: int
    """The worker's rank."""
    consumed: tuple[ConsumedTensor, ...]
    """Persistent tensors its kernels read, in op order, every record carrying ``rank``."""
    unreadable: tuple[str, ...]
    """Op inputs the recorder could not digest, with the reason."""


@dataclass(frozen=True)
class Measurement:
    """Generation throughput measured at one point of an arm's life."""

    label: ProbeLabel
    """``cold_B/throughput`` or ``<path>/throughput`` (after that path's refit to B)."""
    batch: int
    """Prompts per run."""
    output_len: int
    """Tokens asked per prompt."""
    tokens_per_s: tuple[float, ...]
    """Generated tokens per second of each timed run."""


@dataclass(frozen=True)
class Completions:
    """Greedy completions of the accuracy prompts at one point of an arm's life (``--accuracy``)."""

    label: ProbeLabel
    """``cold_B/accuracy``, ``cold_B_damaged/accuracy`` or ``<path>/accuracy`` (after its refit to B)."""
    tokenizer: str
    """Which tokenizer encoded the prompts and decoded the completions: the checkpoint's own
    (its directory) or ``harness character-level (N ids)``."""
    texts: tuple[str, ...]
    """Decoded completion of each prompt, in prompt order (ids the tokenizer does not know decode to nothing)."""
    token_ids: tuple[tuple[int, ...], ...] = ()
    """Generated token ids of each prompt, as the engine returned them."""


@dataclass(frozen=True)
class CpuCapabilities:
    """The CPU as vLLM's CPU dispatch sees it (``harness.cpu_isa``): what decides which kernels
    an engine gets, and so what a refit can leave stale."""

    arch: str
    """``platform.machine()``: ``x86_64``, ``aarch64``..."""
    vendor: str
    """``GenuineIntel``, ``AuthenticAMD``...; empty where unknown."""
    flags: tuple[str, ...]
    """The dispatch capabilities present as vLLM sees them, after any override (torch's names:
    ``avx2``, ``avx512_f``, ``avx512_bf16``, ``amx_tile``, ``amx_bf16``...), sorted."""
    level: str
    """One word for ``flags``: ``amx``, ``avx512_bf16``, ``avx512``, ``avx2``, ``arm_bf16``, ``arm``."""
    host_flags: tuple[str, ...]
    """The same capabilities of the CPU itself, before the override."""
    override: str = "native"
    """``native``, or the level forced with ``--cpu-isa`` / ``REFIT_HARNESS_CPU_ISA``."""
    is_zen_cpu: bool = False
    """vLLM's ``current_platform.is_zen_cpu()`` (an AMD CPU with AVX-512 and zentorch: zentorch
    linears instead of oneDNN); in a parent-side record, the same test made from /proc/cpuinfo."""
    kernel_library: str = ""
    """The vLLM CPU extension loaded in the worker (``_C`` for AVX512-BF16, ``_C_AVX512``,
    ``_C_AVX2``); empty where not read (the parent)."""
    onednn_max_cpu_isa: str = ""
    """``ONEDNN_MAX_CPU_ISA`` the engine ran with (an override sets it); empty: the CPU's own."""
    source: str = ""
    """Who read it: ``torch (worker)``, ``torch (arm)`` or ``/proc/cpuinfo`` (the parent)."""


@dataclass(frozen=True)
class KernelPath:
    """Which CPU kernel one layer got at load time (read in the worker after the cold start)."""

    module: str
    """Module name, e.g. ``model.layers.0.self_attn.qkv_proj``."""
    kind: Literal["linear", "conv1d", "moe", "attention"]
    """What the layer computes."""
    path: str
    """The branch taken: ``sgl weight_packed_linear``, ``oneDNN onednn_mm``, ``zentorch``,
    ``torch linear``; ``prepacked``/``not prepacked`` (causal conv1d); the fused-experts class and
    its ``isa`` (MoE); the attention implementation and its ``isa``."""


@dataclass(frozen=True)
class ArmResult:
    """One engine lifetime: its observations, or the error that ended it."""

    arm: str
    """Arm name, unique within a run, e.g. ``reference``, ``subject-reload_weights+discard_reload``."""
    role: ArmRole
    """Reference (cold B), noise (a second cold B), subject (warm A->B through a path) or
    damaged (cold on a damaged copy of B: the accuracy probe's discriminating power)."""
    paths: tuple[str, ...]
    """Reload paths the subject exercises, one segment each; empty for reference and noise arms."""
    status: ArmStatus
    """``ok`` if every step ran; ``error`` otherwise (observations so far are kept)."""
    error: str | None
    """One-paragraph description of what went wrong, or None."""
    observations: tuple[Observation, ...]
    """Observations in the order they were taken."""
    seconds: float
    """Wall time of the arm, engine start included."""
    environment: tuple[tuple[str, str], ...] = field(default=())
    """vLLM/torch versions, device, digest algorithm and similar facts read inside the arm."""
    failed_path: str | None = None
    """With ``status`` error: the reload path whose segment was running when the arm failed
    (None: the cold start, or not known). Segments before it completed and are judged."""
    failed_step: str | None = None
    """With ``status`` error: the step that was running, e.g. ``refit B_control`` or ``observe warm_B``."""
    key: str = ""
    """What the arm was measured with (plan, checkpoint fingerprints, vLLM version, harness
    commit), hashed; ``--resume`` keeps a finished arm only when its key still matches."""
    cold_starts: int = 0
    """Engines this arm started: 1, plus one per refit through a path that restarts the engine."""
    measurements: tuple[Measurement, ...] = field(default=())
    """Throughput probes (``--throughput``), in the order taken."""
    completions: tuple[Completions, ...] = field(default=())
    """Accuracy probes (``--accuracy``), in the order taken."""
    refused: str | None = None
    """vLLM's own refusal to build this engine here (e.g. an attention head size or block
    size its backend does not support): its exception, when the cold start or the first
    observation (before any refit) failed with one. The paths of such an arm are SKIPPED
    with this reason, not ERROR."""

    cpu: CpuCapabilities | None = None
    """The CPU as vLLM saw it in this arm (its worker after the cold start; the arm process
    where the engine never started); None in records from older harnesses."""
    kernel_paths: tuple[KernelPath, ...] = field(default=())
    """The kernel each linear, conv1d, MoE and attention layer got at the cold start (rank 0)."""

    def observation(self, label: ObservationLabel) -> Observation | None:
        return next((o for o in self.observations if o.label == label), None)
