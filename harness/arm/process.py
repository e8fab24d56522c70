"""Entry point of one isolated engine arm: ``python -m harness.arm.process PLAN RESULT``.

Reads an ArmPlan, starts a real vLLM engine, runs the steps, and writes an ArmResult.
The result is rewritten after every observation, so a crash or kill keeps what was
already measured.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import re
import sys
import threading
import time
import traceback
from pathlib import Path

from harness import store
from harness.arm.engines import DeclinedByVllm, EngineBase, build_engine
from harness.plan import ArmPlan, Probe, Refit, Step
from harness.records import (
    ArmResult,
    Completions,
    ConsumedTensor,
    CpuCapabilities,
    EncoderCacheEntry,
    GraphRead,
    InFlightRequest,
    KernelPath,
    Measurement,
    ModelInfo,
    Observation,
    ObservationLabel,
    ProbeLabel,
    PromptOutput,
    RankCensus,
    RankRecording,
    UnobservedRecord,
)
from harness.settings import BUILD_ENV, FORKED_ARM_ENV, OVERLAY_ENV, PATCHES_ENV
from harness.spec.run import PromptSpec


def observe(
    engine: EngineBase,
    arm: ArmPlan,
    label: ObservationLabel,
    in_flight: tuple[InFlightRequest, ...] = (),
    probe_graphs: bool = False,
) -> Observation:
    """Census, one recorded forward (a long prefill and a decode step inside the captured batch
    sizes), greedy outputs; and, right after a refit under CUDA graphs (``probe_graphs``), which
    moved tensors captured graphs still read at their old storage. ``in_flight``: the requests
    the refit before this observation saw generating, followed to their end.

    Every observation starts with one short request, so its census and recorded forward follow a
    forward on the engine as it is now, on a cold arm as on a warm one: state a model derives
    lazily on a forward exists on both sides, a copy left from before the refit is named STALE
    (not EXTRA or CORRUPT), and state a correct model rebuilds lazily after a refit is rebuilt
    before it is judged (not MISSING). A model that takes images has its encoder cache read
    first (what the refit left servable) and last (what its requests were served)."""
    kept = encoder_cache(engine, arm)
    engine.generate(warm_up_prompt(arm.prompts))
    per_rank = [
        store.from_jsonable(RankCensus, r)
        for r in engine.rpc(
            "refit_harness_census", {"checkpoint_names": [arm.refit_checkpoints.control_tensor], "digest": arm.digest}
        )
    ]
    first = per_rank[0]
    model = ModelInfo(
        architecture=first.architecture,
        packed_modules_mapping=first.packed_modules_mapping,
        world_size=len(per_rank),
        weight_names=first.weight_names,
        quant_kernels=first.quant_kernels,
    )
    unobserved = [u for r in per_rank for u in r.unobserved]
    # Census first, then one recorded forward, then the outputs: every arm sees the same sequence.
    try:
        consumed, unreadable = record_consumed(engine, arm.prompts, arm.digest, graph_prompts(arm, max_tokens=2))
        unobserved += [UnobservedRecord("<kernel-input>", "forward", why) for why in unreadable]
    except Exception as exc:
        consumed = ()
        unobserved.append(UnobservedRecord("<kernel-inputs>", "forward", f"{type(exc).__name__}: {exc}"[:300]))
    drafted_before = engine.draft_counts()
    outputs = decoded(engine.generate(arm.prompts), arm)
    drafted_after = engine.draft_counts()
    served = encoder_cache(engine, arm)
    drafts = (
        None
        if drafted_before is None or drafted_after is None
        else (drafted_after[0] - drafted_before[0], drafted_after[1] - drafted_before[1])
    )
    graph_reads: tuple[GraphRead, ...] = ()
    if probe_graphs:
        try:
            graph_reads = probe_graph_reads(engine, arm)
        finally:
            engine.rpc("refit_harness_release_held")
    return Observation(
        label=label,
        tensors=tuple(t for r in per_rank for t in r.tensors),
        consumed=consumed,
        hooks=first.hooks,
        outputs=outputs,
        model=model,
        unobserved=tuple(unobserved),
        graph_reads=graph_reads,
        graphs_probed=probe_graphs,
        in_flight=in_flight,
        drafts=drafts,
        encoder_cache=served,
        encoder_cache_kept=None if kept is None else len(kept),
    )


def encoder_cache(engine: EngineBase, arm: ArmPlan) -> tuple[EncoderCacheEntry, ...] | None:
    """Rank 0's encoder cache, for image prompts; None for text prompts or a runner without one."""
    if arm.prompts.images is None:
        return None
    found = engine.rpc("refit_harness_encoder_cache", {"digest": arm.digest})[0]
    return None if found is None else tuple(EncoderCacheEntry(h, d) for h, d in found)


WARM_UP_TOKENS = 8
"""Tokens of the warm-up request: fewer than a KV block holds, so prefix caching keeps none of it."""


def warm_up_prompt(prompts: PromptSpec) -> PromptSpec:
    """One short request, one token: the first few tokens of the first prompt."""
    return PromptSpec(token_ids=(tuple(prompts.token_ids[0][:WARM_UP_TOKENS]),), max_tokens=1, logprobs=1)


def graph_prompts(arm: ArmPlan, max_tokens: int = 4) -> PromptSpec:
    """A batch whose every step runs inside the captured CUDA graph sizes: four prompts of three
    tokens (a 12-token prefill; vLLM captures up to ``min(2 * max_num_seqs, 512)`` tokens, 16 for
    the default 8 sequences), then decode steps of four sequences."""
    first = tuple(arm.prompts.token_ids[0])
    batch = min(4, arm.engine.max_num_seqs)
    tokens = first * (-(-3 * batch // len(first)))  # at least three tokens per prompt
    return PromptSpec(
        token_ids=tuple(tokens[i * 3 : i * 3 + 3] for i in range(batch)),
        max_tokens=max_tokens,
        logprobs=max(1, arm.prompts.logprobs),
    )


def graphs_active(arm: ArmPlan) -> bool:
    """Whether the arm's engine captures CUDA graphs: compiled, on a GPU (or
    ``REFIT_HARNESS_PROBE_GRAPHS=1``), one engine throughout."""
    from harness.device import cuda_available
    from harness.settings import PROBE_GRAPHS_ENV

    on = cuda_available() or os.environ.get(PROBE_GRAPHS_ENV) == "1"
    return on and (arm.requirements.mode or arm.engine.mode) == "compiled" and not arm.requirements.restarts


GRAPH_PROBE_BISECT = 8
"""Moved tensors poisoned one at a time, at most, once poisoning them all changed the outputs."""


def probe_graph_reads(engine: EngineBase, arm: ArmPlan) -> tuple[GraphRead, ...]:
    """For every tensor that moved across the refit, whether a captured graph still reads its
    old storage (``harness.worker.graph_reads``): its old address a captured input, or poisoning
    its old bytes changes a generate inside the captured sizes."""
    per_rank = engine.rpc("refit_harness_moved_tensors")
    if not any(r.get("held") for r in per_rank):
        return ()
    reads: list[GraphRead] = []
    for r in per_rank:
        for name in r["captured"]:
            reads.append(GraphRead(name, r["rank"], "read", "its old address is an input of a captured graph"))
        for name, why in r["refused"].items():
            reads.append(GraphRead(name, r["rank"], "unchecked", why))
    suspects = sorted({n for r in per_rank for n in r["poisonable"]})
    if not suspects:
        return tuple(reads)
    prompts = graph_prompts(arm)
    first, again = engine.generate(prompts), engine.generate(prompts)
    ranks = [r["rank"] for r in per_rank]

    def verdicts(status, evidence, names):
        return [GraphRead(n, rank, status, evidence) for n in names for rank in ranks]

    if first != again:
        return tuple(
            reads + verdicts("unchecked", "the batch inside the captured sizes is not deterministic", suspects)
        )

    def changes(names: list[str]) -> bool:
        engine.rpc("refit_harness_flip_held", {"names": names})
        try:
            return engine.generate(prompts) != first
        finally:
            engine.rpc("refit_harness_flip_held", {"names": names})  # flipped back: the old bytes again

    unread = "poisoning its old storage left a generate inside the captured sizes bit-identical"
    if not changes(suspects):
        return tuple(reads + verdicts("unread", unread, suspects))
    for name in suspects[:GRAPH_PROBE_BISECT]:
        if changes([name]):
            reads += verdicts("read", "poisoning its old storage changed a generate inside the captured sizes", [name])
        else:
            reads += verdicts("unread", unread, [name])
    rest = suspects[GRAPH_PROBE_BISECT:]
    return tuple(reads + verdicts("unchecked", f"not poisoned alone (only the first {GRAPH_PROBE_BISECT} are)", rest))


def decoded(outputs: tuple[PromptOutput, ...], arm: ArmPlan) -> tuple[PromptOutput, ...]:
    """Text prompts' outputs with their text, decoded by the checkpoint's own tokenizer."""
    if not arm.prompts.texts:
        return outputs
    from dataclasses import replace

    from harness.tokenizer import own_tokenizer

    tokenizer = own_tokenizer(arm.checkpoints.a)
    return tuple(replace(o, text=tokenizer.decode(list(o.token_ids))) for o in outputs) if tokenizer else outputs


def record_consumed(
    engine: EngineBase, prompts: PromptSpec, digest: str = "auto", decode: PromptSpec | None = None
) -> tuple[tuple[ConsumedTensor, ...], list[str]]:
    """The dispatch recorder on, in every worker, over one long prefill of the first prompt and,
    with ``decode``, a small batch whose prefill and decode steps fall inside the captured CUDA
    graph sizes (decode kernels read what a long prefill may not); also the op inputs the
    recorder could not digest, with the reason. Under CUDA graphs a replay dispatches no op, so
    what it records there is the eager part; the graph reads are ``probe_graph_reads``'s."""
    engine.rpc("refit_harness_recorder_start", {"digest": digest})
    try:
        engine.generate(PromptSpec(token_ids=prompts.token_ids[:1], max_tokens=1, logprobs=1))
        if decode is not None:
            engine.generate(decode)
    finally:
        per_rank = [store.from_jsonable(RankRecording, r) for r in engine.rpc("refit_harness_recorder_stop")]
    return tuple(c for r in per_rank for c in r.consumed), [why for r in per_rank for why in r.unreadable]


def measure_throughput(engine: EngineBase, arm: ArmPlan, label: ProbeLabel) -> Measurement:
    """Greedy generation of a batch of the fixed prompts: one untimed warm-up, then timed runs."""
    spec = arm.throughput
    assert spec is not None, "a measure step without a throughput spec"
    batch = tuple(arm.prompts.token_ids[i % len(arm.prompts.token_ids)] for i in range(spec.batch))
    prompts = PromptSpec(token_ids=batch, max_tokens=spec.output_len, logprobs=0)
    engine.generate(prompts)
    rates = []
    for _ in range(spec.repetitions):
        t0 = time.perf_counter()
        outputs = engine.generate(prompts)
        elapsed = time.perf_counter() - t0
        rates.append(round(sum(len(o.token_ids) for o in outputs) / elapsed, 3))
    return Measurement(label=label, batch=spec.batch, output_len=spec.output_len, tokens_per_s=tuple(rates))


def measure_accuracy(engine: EngineBase, arm: ArmPlan, label: ProbeLabel) -> Completions:
    """Greedy completions of the accuracy prompts, tokenized and decoded here (B's tokenizer,
    or the harness's character-level one), so the parent never needs a tokenizer."""
    from harness.tokenizer import load_tokenizer

    spec = arm.accuracy
    assert spec is not None, "an accuracy step without accuracy prompts"
    name, encode, decode = load_tokenizer(arm.checkpoints.b)
    ids = tuple(tuple(encode(p)) for p in spec.prompts)
    room = arm.engine.max_model_len - spec.max_tokens
    too_long = next((i for i, t in enumerate(ids) if len(t) > room), None)
    if too_long is not None:
        raise ValueError(
            f"accuracy prompt {too_long} is {len(ids[too_long])} tokens; with max_tokens "
            f"{spec.max_tokens} it does not fit max_model_len {arm.engine.max_model_len}"
        )
    outputs = engine.generate(PromptSpec(token_ids=ids, max_tokens=spec.max_tokens, logprobs=0))
    return Completions(
        label=label,
        tokenizer=name,
        texts=tuple(decode(list(o.token_ids)) for o in outputs),
        token_ids=tuple(o.token_ids for o in outputs),
    )


def environment(digest: str = "auto") -> tuple[tuple[str, str], ...]:
    """Facts of this arm's machine and software; ``digest``: the arm's ``DigestChoice``,
    recorded as the algorithm it means here (the workers resolve it the same way)."""
    import torch
    import vllm

    from harness.worker.digest import resolve

    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"cpu ({platform.processor() or platform.machine()})"
    )
    facts = [
        ("vllm", vllm.__version__),
        ("torch", torch.__version__),
        ("device", device),
        ("python", platform.python_version()),
        ("digest", resolve(digest)),
        ("python_executable", sys.executable),
        ("vllm_path", str(Path(vllm.__file__).parent)),
        ("torch_git_sha", str(getattr(torch.version, "git_version", "") or "")),
        # speed is comparable across runs only on an unloaded machine: say how loaded it was
        ("load_average", f"{os.getloadavg()[0]:.2f}"),
        ("cpus", str(os.cpu_count() or 1)),
        # forked from the run's warm interpreter (harness.arm.zygote), or a fresh python
        ("arm_process", f"forked from {os.environ[FORKED_ARM_ENV]}" if os.environ.get(FORKED_ARM_ENV) else "fresh"),
    ]
    # setuptools-scm records the commit of a source build in vllm/_version.py (None for PyPI wheels);
    # a vLLM without the module has no commit to record: asked, not caught.
    from harness.worker.vllm_compat import module_exists

    commit = ""
    if module_exists("vllm._version"):
        from vllm import _version

        commit = str(getattr(_version, "__commit_id__", None) or "")
    facts.append(("vllm_git_sha", commit))
    build = os.environ.get(BUILD_ENV)
    if build:
        facts.append(("build", build))
    overlay = os.environ.get(OVERLAY_ENV)
    if overlay:  # an overlay build (harness.builds.overlay): its packages over another environment
        facts.append(("build_overlay", overlay))
    patches = os.environ.get(PATCHES_ENV)
    if patches:  # a patched build: vLLM's version is the base's, these diffs are applied on top
        facts.append(("vllm_patches", patches))
    return tuple(facts)


def arm_capabilities() -> CpuCapabilities | None:
    """The CPU as vLLM sees it in the arm process (recorded even when no engine starts)."""
    from harness.worker.cpu_dispatch import capabilities

    try:
        return capabilities("torch (arm)")
    except Exception:
        traceback.print_exc()
        return None


def worker_dispatch(
    engine: EngineBase, fallback: CpuCapabilities | None
) -> tuple[CpuCapabilities | None, tuple[KernelPath, ...]]:
    """Rank 0's view of the CPU and the kernel each layer got; the arm's view where the
    worker cannot say (the reasons are in the arm's log)."""
    try:
        first = engine.rpc("refit_harness_cpu_dispatch")[0]
        return (
            store.from_jsonable(CpuCapabilities, first["cpu"]),
            store.from_jsonable(tuple[KernelPath, ...], first["kernel_paths"]),
        )
    except Exception:
        traceback.print_exc()
        return fallback, ()


def run(arm: ArmPlan, result_path: Path) -> ArmResult:
    from harness.paths import PATHS

    started = time.monotonic()
    observations: list[Observation] = []
    measurements: list[Measurement] = []
    completions: list[Completions] = []
    env: tuple[tuple[str, str], ...] = ()
    cpu: list[CpuCapabilities | None] = [None]  # the arm's view, then the worker's
    kernels: list[tuple[KernelPath, ...]] = [()]
    current: list[tuple[str | None, str | None]] = [(None, None)]  # (path, step) running now
    save_lock = threading.Lock()  # the watchdog thread saves too
    cold_starts = 0
    in_flight: tuple[InFlightRequest, ...] = ()  # what the last refit saw of requests in flight

    def save(status: str, error: str | None, refused: str | None = None) -> ArmResult:
        path, step = current[0] if status == "error" else (None, None)
        result = ArmResult(
            arm=arm.name,
            role=arm.role,
            paths=arm.paths,
            status=status,
            error=error,
            observations=tuple(observations),
            seconds=round(time.monotonic() - started, 2),
            environment=env,
            failed_path=path,
            failed_step=step,
            cold_starts=cold_starts,
            measurements=tuple(measurements),
            completions=tuple(completions),
            refused=refused,
            cpu=cpu[0],
            kernel_paths=kernels[0],
        )
        with save_lock:
            store.dump(result, result_path, "arm_result")
        return result

    paths = {}
    engine = None
    held = False  # the worker holds every tensor as it was before the last refit
    watchdog = threading.Event()
    try:
        env = environment(arm.digest)
        cpu[0] = arm_capabilities()
        paths = {name: PATHS.get(name)(arm.refit_checkpoints, arm.prompts) for name in arm.paths}
        for path in paths.values():
            if getattr(path, "trains", False):
                path.spec = arm.trainer  # type: ignore[attr-defined]  # a trainer path's trainer spec
        cold_starts += 1
        engine = build_engine(arm, result_path.parent)
        watchdog = watch_engine_processes(lambda why, e=engine: save("error", with_logged_error(why, e)))
        cpu[0], kernels[0] = worker_dispatch(engine, cpu[0])
        for step in arm.steps:
            print(f"[{arm.name}] {describe_step(step)}", flush=True)
            if isinstance(step, Refit):
                owner = step.owner
                current[0] = (owner, f"refit {step.target}")
                # Say where we are before a step that can hang or kill the engine: if the arm
                # is killed here, the record charges the failure to this segment, not the earlier ones.
                save("error", f"arm stopped during {current[0][1]} of {owner}")
                path = paths[step.path]
                # Under CUDA graphs, hold every tensor across the refit: a moved one's old storage
                # is what the captured graphs may still read (``probe_graph_reads``).
                held = graphs_active(arm) and bool(engine.rpc("refit_harness_hold_tensors"))
                restart = (
                    path.sabotaged_refit(engine, step.target)
                    if step.sabotaged
                    else path.refit(engine, arm.refit_checkpoints.directory(step.target), step.target)
                )
                in_flight = path.take_in_flight()
                if restart is not None:
                    held = False
                    watchdog.set()  # the old engine's processes end on purpose
                    engine.close(wait=True)
                    engine = None  # if the new engine fails to start, the old one is not closed twice
                    cold_starts += 1
                    engine = build_engine(
                        arm, result_path.parent, {"model": restart.model, "load_format": restart.load_format}
                    )
                    watchdog = watch_engine_processes(lambda why, e=engine: save("error", with_logged_error(why, e)))
            elif isinstance(step, Probe):
                label = step.label
                current[0] = (label.after.path, f"{_PROBE_ACTION[label.probe]} {label.probe}")
                if label.probe == "accuracy":
                    completions.append(measure_accuracy(engine, arm, label))
                    save("error", f"arm stopped after the accuracy probe {str(label)!r}")
                else:
                    measurements.append(measure_throughput(engine, arm, label))
                    save("error", f"arm stopped after measuring {str(label)!r}")
            else:
                current[0] = (step.label.path, f"observe {step.label.stage}")
                observations.append(observe(engine, arm, step.label, in_flight, probe_graphs=held))
                held = False
                in_flight = ()
                # Keep what was measured; if the arm dies later, this file says so.
                save("error", f"arm stopped after observing {str(step.label)!r}")
        current[0] = (None, None)
        return save("ok", None)
    except Exception as exc:
        traceback.print_exc()
        inner = root_cause(exc)
        message = (
            f"{type(exc).__name__}: {exc}"
            if inner is exc
            else f"{type(inner).__name__}: {inner} (raised through {type(exc).__name__})"
        ).strip()[:2000]
        # The cold start or the first observation (the CPU attention op refuses a head size at
        # the first forward, not at start-up), before any segment: the engine never ran.
        never_ran = cold_starts == 1 and not observations and current[0][0] is None
        return save("error", message, refused=message if never_ran and refused_by_vllm(exc) else None)
    finally:
        watchdog.set()  # from here on, engine processes exit on purpose
        for path in paths.values():
            path.close()
        if engine is not None:
            with collections_skipped():
                engine.close()


@contextlib.contextmanager
def collections_skipped():
    """``gc.collect`` does nothing inside: for the engine's last shutdown, just before the arm's
    process exits. vLLM's shutdown frees memory with two full collections (the model runner's
    cleanup, and ``cleanup_dist_env_and_memory`` after ``gc.unfreeze``): 0.9 s of a core in every
    arm, over a heap of vLLM and torch (measured with py-spy on the AMX Xeon). The rest of the
    shutdown runs as it was."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


def root_cause(exc: BaseException) -> BaseException:
    """The exception a Ray task error carries (``RayTaskError.cause``, one per actor hop). Its
    text leads the arm's error, so that vLLM's own words survive the recorded 2000 characters
    (measured: a trainer actor's error around the engine actor's lost them) and can be matched."""
    while isinstance(getattr(exc, "cause", None), BaseException):
        exc = exc.cause  # type: ignore[attr-defined]
    return exc


_PROBE_ACTION = {"throughput": "measure", "accuracy": "accuracy"}


def describe_step(step: Step) -> str:
    """One line of the arm's log per step."""
    if isinstance(step, Refit):
        return f"refit {step.target} via {step.path}" + (" (sabotaged)" if step.sabotaged else "")
    if isinstance(step, Probe):
        return f"{_PROBE_ACTION[step.label.probe]} {step.label}"
    return f"observe {step.label}"


_UNSUPPORTED = re.compile(
    r"\b(not supported|unsupported|not implemented)\b"
    # vLLM's kernel selection finding no kernel for a quantized layer on this platform
    r"|Failed to find a kernel that can implement"
    # a custom op the CPU build declares without a kernel, so with no arguments at all
    # (measured: "_C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4")
    r"|_C::\w+\(\) expected at most 0 argument"
    # a configuration a vLLM option refuses by design (0.34: "Direct reload does not support LoRA.")
    r"|\bdoes not support\b"
    # a kernel that needs a CPU capability this one lacks
    # (measured without AVX-512: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.")
    r"|\brequires\b[^.]*\b(AVX-?512|AMX)\b"
    # a kernel that takes none of the model's dtype (measured: vLLM 0.32 picks its AMX MLA backend
    # for a float32 MLA model, whose weight packing says "expect weight to be bfloat16, float16,
    # int8, fp8_e4m3 or uint8(mxfp4 or int4).")
    r"|\bexpect weight to be\b",
    re.IGNORECASE,
)
# An op the CPU extension vLLM loaded for this CPU does not have: vLLM chose a kernel whose op is
# built only into its AVX-512 extensions (measured on ``_C_AVX2``, at the first forward of a GPTQ or
# AWQ engine: "'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'").
_MISSING_OP = re.compile(r"'_C' object has no attribute '\w+'")
# An assertion by which vLLM's set-up states a configuration it cannot run (measured: a draft-model
# drafter of a model with sliding-window and full attention layers, in spec_decode's proposer:
# "All drafting layers should belong to the same kv cache group"). Any other assertion is a bug.
_DECLINING_ASSERTION = re.compile(r"should belong to the same kv cache group")


def refused_by_vllm(exc: BaseException) -> bool:
    """Is this vLLM declining to build the engine here, rather than a bug? Measured forms:
    "Unsupported CPU attention configuration: head_dim=16" (a RuntimeError from the CPU
    attention op), "Head dimension 48 is not supported by MLA", "Unsupported block size: 16",
    and for quantized engines "Failed to find a kernel that can implement the ScaledMM linear
    layer" and a CPU-build op stub ("_C::static_scaled_fp8_quant() expected at most 0
    argument(s)", raised from vLLM's ``_custom_ops``). Without AVX-512, "FP8 KV cache on CPU
    requires x86 with AVX-512 or AMX.", and an AttributeError for an op missing from the loaded
    CPU extension ("'_C' object has no attribute 'cpu_gemm_wna16'"), and a drafter vLLM cannot
    set up ("All drafting layers should belong to the same kv cache group", an AssertionError).
    On AMX, a float32 MLA model: "expect weight to be bfloat16, float16, int8, ...".
    So: an exception that says the configuration is not supported, or that the loaded kernel
    library lacks an op, raised where the deepest frame in vLLM or the harness is vLLM's. A failure raised by the harness (its extension, a
    fixture model) stays an error. With ``--engine-core-process`` the client only sees
    "Engine core initialization failed", which is not a refusal either."""
    if isinstance(exc, DeclinedByVllm):
        return True
    if isinstance(exc, AttributeError):
        if not _MISSING_OP.search(str(exc)):
            return False
    elif isinstance(exc, AssertionError):
        if not _DECLINING_ASSERTION.search(str(exc)):
            return False
    elif not isinstance(exc, (ValueError, NotImplementedError, RuntimeError)) or not _UNSUPPORTED.search(str(exc)):
        return False
    import vllm

    roots = {"vllm": str(Path(vllm.__file__).parent), "harness": str(Path(__file__).parents[1])}
    owners = [
        owner
        for frame in traceback.extract_tb(exc.__traceback__)
        for owner, root in roots.items()
        if frame.filename.startswith(root + os.sep)
    ]
    return bool(owners) and owners[-1] == "vllm"


def with_logged_error(why: str, engine) -> str:
    """An engine process's death, with the exception its processes logged before it, if the engine
    keeps their log apart (``vllm serve``): the death is the consequence, that error the cause."""
    cause = engine.logged_error() if engine is not None else None
    return f"{why}; it logged: {cause}" if cause else why


def watch_engine_processes(on_death) -> threading.Event:
    """If an engine process dies under us, end the arm now instead of hanging.

    Measured with vLLM 0.32: after its EngineCore is killed, ``LLM.generate`` in the client
    waits on its output queue forever. The arm timeout would end that eventually; this
    turns it into an ERROR within a second, keeping what was observed. Set the returned
    event before shutting the engine down on purpose.
    """
    import psutil

    stop = threading.Event()
    engines = [(p, label) for p in psutil.Process().children(recursive=True) if (label := _engine_label(p))]

    def alive(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def watch() -> None:
        while not stop.wait(0.5):
            dead = next(((p, label) for p, label in engines if not alive(p)), None)
            if dead and not stop.is_set():
                on_death(f"engine process {dead[0].pid} ({dead[1]}) died during the arm")
                print(f"engine process {dead[0].pid} died; ending the arm", flush=True)
                os._exit(3)

    threading.Thread(target=watch, name="refit-harness-engine-watchdog", daemon=True).start()
    return stop


def _engine_label(p) -> str | None:
    try:
        cmd = " ".join(p.cmdline())
    except Exception:
        return None
    return next((tag for tag in ("EngineCore", "VLLM::Worker") if tag in cmd), None)


def die_with_parent_and_deadline(deadline_s: float) -> None:
    """The arm's engines must not outlive the run, whatever happens to the parent.

    The arm leads its own process group (the engine core, its workers and a ``vllm serve``
    with its engine core are all in it). A watcher thread kills the whole group when the
    parent pid changes (the parent died: a Ray actor killed, the CLI SIGKILLed) or when the
    arm's own deadline passes (the parent's timeout lives in the parent). Not
    PR_SET_PDEATHSIG: it would kill this process alone, watcher included, and leave the
    engine core running (measured: tests/unit/test_arm_lifetime.py).
    """
    import signal

    if os.getpgrp() != os.getpid():
        return  # not started by the runner (which makes the arm a group leader): nothing of ours to kill
    parent = os.getppid()
    end = time.monotonic() + deadline_s

    def watch() -> None:
        while True:
            orphaned = os.getppid() != parent
            if orphaned or time.monotonic() > end:
                try:  # stdout may be a pipe to the dead parent
                    print(
                        "refit-harness arm: "
                        + ("parent died" if orphaned else f"own deadline of {deadline_s:.0f} s passed")
                        + "; killing the arm's process group",
                        flush=True,
                    )
                except OSError:
                    pass
                os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(0.25)

    threading.Thread(target=watch, name="refit-harness-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    plan_path, result_path = Path(argv[0]), Path(argv[1])
    arm = store.load(ArmPlan, plan_path, "arm_plan")
    # A little after the parent's timeout, which normally ends the arm first and says why.
    die_with_parent_and_deadline(arm.timeout_s + 15)
    # Before torch or vLLM start here: every process the arm starts inherits the override.
    from harness.worker.cpu_dispatch import prepare_arm

    prepare_arm(arm.engine.cpu_isa)
    os.environ.update(arm.engine.reload_env())
    result = run(arm, result_path)
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
