"""The GPU nightly's second review (``docs/gpu-nightly.md``, "What the second review found"): one
test per defect, each failing on the code before its fix. No engine starts here; vLLM's own
classes are imported where a check can use them."""

from __future__ import annotations

from harness.paths import PATHS
from harness.spec.known_issues import KNOWN_ISSUES, KnownIssue, Subject

# ---- known issues scoped by what causes them --------------------------------------------------

CPU_KERNELS = "the CPU backend's own kernel or weight layout"
DEVICE_SCOPED: dict[str, str] = {
    "Layerwise reload finishes a fused layer early when part of it is sent twice, and the rest of the layer's loads then fail": (
        f"{CPU_KERNELS}: the loud form (AttributeError 'weight_loader') needs the CPU hook's new Parameter; "
        "elsewhere the late load is dropped silently"
    ),
    "CPU: every reload in VLLM_RELOAD_MODE=direct raises: the linear post-load hook replaces the weight Parameters": (
        f"{CPU_KERNELS}: dispatch_cpu_unquantized_gemm registers a new, empty Parameter per linear"
    ),
    "CPU: in fp16 the attention impl's float32 copy of the sinks, made on the first forward, is never "
    "refreshed by a refit": (
        f"{CPU_KERNELS}: _C's cpu_attention_with_kv_cache takes sinks in bf16 or float32 only, so the CPU "
        "attention impl converts them (a CUDA backend's sinks path was not measured)"
    ),
    "CPU: a tied lm_head keeps the kernel copy of the old embedding after every in-place refit": (
        f"{CPU_KERNELS}: the head's GEMM copy (SGL packed weight, oneDNN handle) is built by the CPU post-load hook"
    ),
    "CPU fp8 block kernel: a linear layer with a bf16 bias cannot run (fp8_scaled_mm_cpu takes fp32 only)": (
        f"{CPU_KERNELS}: _C.fp8_scaled_mm_cpu"
    ),
    "CPU int4 W4A8: after reload_weights a layer's bias is not rounded to the model dtype": (
        f"{CPU_KERNELS}: CPUWNA16LinearKernel's W4A8 path widens the bias in place"
    ),
    "CPU W8A8 int8 (oneDNN path): after reload_weights the scaled-mm handler reads a freed weight scale": (
        f"{CPU_KERNELS}: the oneDNN scaled-mm handler keeps a pointer to the scale"
    ),
    "CPU W8A8 int8 (oneDNN path): a saved sharded state cannot be loaded (KeyError on azp_adj)": (
        f"{CPU_KERNELS}: azp_adj is registered by the oneDNN int8 path's post-load hook"
    ),
    "save_sharded_state raises on fp8 (channel) checkpoints: _filter_subtensors views a transposed weight": (
        f"{CPU_KERNELS}: the non-contiguous weight is the CPU fp8 kernel's transposed view "
        "(a CUDA fp8 kernel's layout was not measured)"
    ),
    "CPU GPTQ int4: a saved sharded state cannot be loaded (the kernel's re-blocked qweight)": (
        f"{CPU_KERNELS}: the CPU WNA16 kernel re-blocks qweight"
    ),
    "CPU: prefix caching with Mamba layers ('align' cache mode) cannot generate": (
        f"{CPU_KERNELS}: the CPU Mamba kernels under the 'align' cache mode"
    ),
    "CPU fused MoE: expert weights are corrupted by reload_weights (unquantized, layerwise reload)": (
        f"{CPU_KERNELS}: _C.cpu_fused_moe's packed experts"
    ),
    "CPU fused MoE: expert weights are corrupted by reload_weights (GraniteMoeHybrid)": (
        f"{CPU_KERNELS}: _C.cpu_fused_moe's packed experts"
    ),
    "CPU fused MoE: expert weights are corrupted by reload_weights (DeepSeek-V2)": (
        f"{CPU_KERNELS}: _C.cpu_fused_moe's packed experts"
    ),
    "CPU: reload_weights leaves MambaMixer2.conv_weights stale where the conv1d weight is prepacked "
    "(AVX512-BF16 or ARM bf16, bf16 weights)": f"{CPU_KERNELS}: the CPU causal-conv1d prepack",
    "CPU (AMX): reload_weights copies a float32 checkpoint's linear bias unrounded into the SGL kernel's "
    "float32 bias; a cold start rounds it to bf16 first": f"{CPU_KERNELS}: the AMX SGL linear widens the bias",
    "CPU (AMX): reload_weights raises on DeepSeek-V2 under the AMX MLA backend (a size-0 kernel tensor)": (
        f"{CPU_KERNELS}: the AMX MLA backend"
    ),
    "CPU: a sharded state saved where the conv1d weight is prepacked cannot be loaded (Mamba2, bf16, "
    "AVX512-BF16)": f"{CPU_KERNELS}: the CPU causal-conv1d prepack",
    "CPU oneDNN kernels keep the old weights after a kernel-format reload (float32)": (
        f"{CPU_KERNELS}: oneDNN handles built by the CPU post-load hook"
    ),
    "CPU: a kernel-format reload leaves every packed bf16 GEMM kernel (oneDNN on AVX-512, SGL on AMX) with "
    "the old weights": f"{CPU_KERNELS}: oneDNN handles and SGL packed weights",
    "CPU: the sharded-state saver skips the empty linear Parameters, so the state cannot be loaded (float32)": (
        f"{CPU_KERNELS}: the CPU backend empties every linear weight Parameter into a oneDNN handle"
    ),
    "CPU: the sharded-state saver skips the empty linear Parameters of bf16 oneDNN kernels, so the state "
    "cannot be loaded (AVX-512)": f"{CPU_KERNELS}: the CPU backend empties bf16 oneDNN linears' Parameters",
    "CPU: a kernel-format reload leaves every oneDNN fp16 GEMM kernel with the old weights (AVX512-FP16)": (
        f"{CPU_KERNELS}: oneDNN handles of fp16 linears"
    ),
    "CPU: the sharded-state saver skips the empty linear Parameters of fp16 oneDNN kernels, so the state "
    "cannot be loaded (AVX512-FP16)": f"{CPU_KERNELS}: the CPU backend empties fp16 oneDNN linears' Parameters",
    "A dummy start with an fp8 KV cache cannot generate: the dummy loader makes the KV scales negative": (
        f"{CPU_KERNELS}: the CPU attention kernel's k_scale check raises (cpu_attn_reshape_and_cache)"
    ),
}
"""Every known issue whose scope names a device, by title, with why its cause lives in that
device's code. A known issue measured on one device whose cause is device-independent (the
scheduler, a cache's keys, the loader) declares ``device=None``, so it is expected everywhere."""


def every_known_issue() -> list[tuple[str, KnownIssue]]:
    """The architecture and kernel issues, and every registered path's own."""
    issues = [("harness.spec.known_issues", k) for k in KNOWN_ISSUES]
    for name in PATHS.names():
        issues += [(name, k) for k in PATHS.get(name).known_issues]
    return issues


def test_every_known_issue_that_names_a_device_says_why_its_cause_is_that_devices():
    scoped = {k.title: owner for owner, k in every_known_issue() if k.device is not None}
    unexplained = sorted(set(scoped) - set(DEVICE_SCOPED))
    assert not unexplained, f"device-scoped known issues without a reason in DEVICE_SCOPED: {unexplained}"
    no_longer = sorted(set(DEVICE_SCOPED) - set(scoped))
    assert not no_longer, f"DEVICE_SCOPED lists issues that no longer name a device: {no_longer}"
    for title, why in DEVICE_SCOPED.items():
        assert why.startswith(CPU_KERNELS), (title, why)


def test_the_42125_prefix_cache_key_issue_is_expected_on_a_gpu():
    """vLLM's LoRA block-hash keys are computed by the scheduler, whatever the device: on a GPU the
    path is XFAIL like on the CPU, not a new FAIL every night (the issue was scoped to ``cpu``)."""
    path = PATHS.get("lora_inplace_same_path")
    for device in ("cpu (x86_64)", "NVIDIA H200"):
        for version in ("0.32.0", "0.34.0"):  # 0.34 measured to have it too (a CPU build)
            known = path.known_issue(Subject(device, version, "Qwen3ForCausalLM", "bfloat16"))
            assert known is not None and "#42125" in known.title, (device, version)
    # A version nobody measured is not assumed to have it.
    assert path.known_issue(Subject("NVIDIA H200", "0.33.0", "Qwen3ForCausalLM", "bfloat16")) is None


def test_a_device_independent_issue_still_keeps_its_other_scopes():
    issue = KnownIssue(device=None, reason="r", vllm=("==0.32.*",), paths=("prefix_cache",))
    assert issue.applies("prefix_cache", Subject("NVIDIA H100 80GB HBM3", "0.32.0", None))
    assert issue.applies("prefix_cache", Subject("cpu (x86_64)", "0.32.0", None))
    assert not issue.applies("reload_weights", Subject("NVIDIA H100 80GB HBM3", "0.32.0", None))
    assert issue.where == "every device"
    assert KnownIssue(device="cuda", reason="r").where == "cuda"
    assert not KnownIssue(device="cuda", reason="r").applies("p", Subject("cpu (x86_64)", None, None))


# ---- the HPC cell without hpc-ops -------------------------------------------------------------


def hpc_groups():
    from harness.spec.scenario import expand
    from scenarios.gpu_nightly import gpu_nightly

    return [g for g in expand(gpu_nightly()) if g.spec.engine.vllm_kwargs().get("attention_backend") == "HPC_ATTN"]


def test_the_hpc_cell_is_skipped_with_the_install_steps_where_hpc_ops_is_missing(monkeypatch):
    """On an sm90 runner without Tencent's ``hpc`` module vLLM raises ImportError while building
    the model; the planner SKIPs every path of the HPC cell groups instead, saying how to get it."""
    import importlib.util

    from harness import device
    from harness.orchestrate.execute import configuration_unavailable

    groups = hpc_groups()
    assert len(groups) == 4  # eager/compiled x TP 1/2
    monkeypatch.setattr(device, "device_tags", lambda: frozenset({"cuda", "sm90"}))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hpc" else real_find_spec(name))
    for group in groups:
        why = configuration_unavailable(group.spec)
        assert why and "module hpc is not installed" in why and "Building hpc-ops" in why, why
    # With the module present, the sm90 runner runs it; elsewhere the device reason comes first.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "hpc" else None)
    assert configuration_unavailable(groups[0].spec) is None
    monkeypatch.setattr(device, "device_tags", lambda: frozenset({"cuda", "sm80"}))
    assert "sm90 only" in (configuration_unavailable(groups[0].spec) or "")


def test_the_preflight_reports_a_missing_hpc_as_a_skip_not_a_problem(monkeypatch):
    import importlib.util

    from harness.arm.preflight import missing_package_findings
    from harness.plan import PreflightCell, PreflightRequest

    group = hpc_groups()[0]
    cells = (
        PreflightCell(id=group.id, gpus=n, arms=(), skipped=(), packages=group.spec.requires_packages) for n in (1, 2)
    )
    request = PreflightRequest(scenario="gpu-nightly", cells=tuple(cells))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    found = missing_package_findings(request)
    assert [(f.kind, f.cell, f.check) for f in found] == [("skip", group.id, "packages")]
    assert "hpc-ops" in found[0].detail and "Building hpc-ops" in found[0].detail
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert [(f.kind, f.detail) for f in missing_package_findings(request)] == [("ok", "hpc installed")]


# ---- the reference observes in the subject's batch shapes -------------------------------------

TARGETS = ("B", "B", "B_control", "A")


def shaped_plan(paths: dict, engine=None):
    from harness.plan import PathNeeds, make_plan
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.run import EngineSpec, RunSpec

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
    needs = {p: PathNeeds(r, TARGETS) for p, r in paths.items()}
    spec = RunSpec(model="/a", paths=tuple(paths), engine=engine or EngineSpec())
    return make_plan(spec, cs, needs, {}, adapters=cs)


def test_subjects_that_batch_otherwise_get_a_cold_b_of_their_own_shapes():
    """HTTP sends one request at a time and the prefix cache prefills the suffix only, while the plain
    reference prefills and decodes every prompt at once: each gets a cold B built to batch as it does."""
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import EngineSpec

    plan = shaped_plan(
        {
            "plain": EngineRequirements(),
            "ray": EngineRequirements(kind="ray_llm", weight_transfer_backend="gloo"),
            "prefix": EngineRequirements(enable_prefix_caching=True),
            "http": EngineRequirements(kind="http"),
            "lora_prefix": EngineRequirements(lora="adapter", enable_prefix_caching=True),
        }
    )
    shaped = {a.name: a.requirements for a in plan.arms if a.role == "shape_reference"}
    assert shaped == {
        "reference-prefix-cache": EngineRequirements(enable_prefix_caching=True),
        "reference-http": EngineRequirements(kind="http", enable_prefix_caching=False),
        "reference-lora-adapter-prefix-cache": EngineRequirements(enable_prefix_caching=True, lora="adapter"),
    }
    assert all(a.start == "B" and len(a.steps) == 1 for a in plan.arms if a.role == "shape_reference")
    # A run with prefix caching on everywhere: the plain reference already caches, so only HTTP differs.
    cached = shaped_plan(
        {"prefix": EngineRequirements(enable_prefix_caching=True), "http": EngineRequirements(kind="http")},
        EngineSpec(engine_args=(("enable_prefix_caching", "true"),)),
    )
    assert [a.name for a in cached.arms if a.role == "shape_reference"] == ["reference-http-prefix-cache"]


def _judged(subject_arm, reference, noise, refit_reference=None):
    from harness.judge.diff import compare_path
    from harness.judge.verdict import judge
    from harness.spec.run import JudgePolicy
    from tests.records import EXPECTED

    c = compare_path(
        "p", subject_arm, reference, noise, "qkv_proj.weight", 1e-4, EXPECTED, refit_reference=refit_reference
    )
    return judge(c, JudgePolicy(), fail_on_rebound=False).status.value


def test_a_refit_judged_against_a_reference_of_other_batch_shapes_fails_and_against_its_own_passes():
    """The defect on synthetic records: a perfect refit whose engine rounds by batch shape (its cold B
    of the same shapes agrees with it) FAILs against the plain reference, whose noise twin shares its
    shapes (floor 0); against the shape reference it PASSes, and a stale refit still FAILs there."""
    from tests.records import B, arm, obs, output, subject

    plain = [output(0, (1, 2, 3), -1.004)]
    reference, noise = (
        arm("reference", "reference", obs("cold_B", B, plain)),
        arm("noise", "noise", obs("cold_B", B, plain)),
    )
    own = arm("reference-http", "shape_reference", obs("cold_B", B))
    assert _judged(subject(), reference, noise) == "FAIL"
    assert _judged(subject(), reference, noise, refit_reference=own) == "PASS"
    assert _judged(subject(warm_b={**B, "norm": "a-n"}), reference, noise, refit_reference=own) == "FAIL"


def test_the_judge_refuses_a_subject_whose_shapes_no_reference_shares():
    """A plan without the subject's shape reference (made before the rule) is refused, not judged."""
    from harness.judge.evaluate import shape_reference
    from harness.judge.verdict import Verdict
    from harness.spec.requirements import EngineRequirements
    from tests.records import arm, obs

    plan = shaped_plan({"http": EngineRequirements(kind="http"), "plain": EngineRequirements()})
    by_name = {a.name: a for a in plan.arms}
    subject_arm, base = by_name["subject-http"], by_name["reference"]
    own = arm("reference-http", "shape_reference", obs("cold_B", {}))
    assert shape_reference(subject_arm, base, plan.arms, {"reference-http": own}) is own
    assert shape_reference(by_name["subject-plain"], base, plan.arms, {}) is None
    old = tuple(a for a in plan.arms if a.role != "shape_reference")
    refused = shape_reference(subject_arm, base, old, {})
    assert isinstance(refused, Verdict) and refused.status.value == "INCONCLUSIVE"
    assert "other batch shapes (http)" in refused.reasons[0], refused.reasons
    never_ran = shape_reference(subject_arm, base, plan.arms, {})
    assert isinstance(never_ran, Verdict) and never_ran.status.value == "ERROR"


# ---- sleep level 2's twin breaks what level 2 restores -----------------------------------------


class _Calls:
    def __init__(self) -> None:
        self.calls: list = []

    def rpc(self, method, kwargs=None):
        self.calls.append(("rpc", method, kwargs or {}))
        return [None]

    def call(self, method, *args, **kwargs):
        self.calls.append(("call", method, kwargs))


def test_the_level2_twin_reloads_and_breaks_the_saved_buffers_restore():
    """The twin used to skip the reload: caught whatever wake_up restored. Now it does everything
    the real refit does, with one saved buffer zeroed between sleep and wake_up."""
    from harness.spec.checkpoint_set import CheckpointSet

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="model.layers.0.input_layernorm.weight")
    path = PATHS.get("sleep_level2")(cs)
    real, twin = _Calls(), _Calls()
    path.refit(real, "/b", "B")
    path.sabotaged_refit(twin, "B")
    planted = ("rpc", "refit_harness_zero_sleep_saved_buffer", {})
    assert planted not in real.calls
    assert [c for c in twin.calls if c != planted] == real.calls
    assert twin.calls.index(planted) == twin.calls.index(("call", "sleep", {"level": 2})) + 1
    assert twin.calls.index(planted) < twin.calls.index(("call", "wake_up", {"tags": ["weights"]}))
    assert ("rpc", "reload_weights", {"weights_path": "/b"}) in twin.calls


def _sleeping_vllm_worker(monkeypatch):
    """vLLM's own GPU ``Worker``, its ``sleep``/``wake_up`` run for real on the CPU: the device
    calls and the cumem backend (level 2 discards the weights) stand in, the buffer save and
    restore are vLLM's."""
    import types

    import torch
    from vllm.v1.worker.gpu_worker import Worker

    class Backend:
        def suspend(self, level):
            for b in model.buffers():  # discarded memory: whatever the woken pages hold
                b.data.fill_(-7)

        def resume(self, tags):
            pass

    model = torch.nn.Module()
    model.rotary_emb = torch.nn.Module()
    model.rotary_emb.register_buffer("cos_sin_cache", torch.arange(8.0), persistent=False)
    model.register_buffer("positions", torch.arange(4), persistent=False)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None, raising=False)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (1 << 30, 2 << 30), raising=False)
    worker = object.__new__(Worker)
    worker.model_runner = types.SimpleNamespace(model=model)
    worker._sleep_mode_backend = Backend()
    worker.vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(enable_nccl_comm_suspend=False))
    worker._sleep_saved_buffers, worker._sleep_saved_draft_buffers, worker._sleep_saved_parameters = {}, {}, {}
    monkeypatch.setattr(Worker, "get_draft_model", lambda self: None, raising=False)
    monkeypatch.setattr(Worker, "_save_sleep_parameters", lambda self, model: None, raising=False)
    monkeypatch.setattr(Worker, "synchronize_device", lambda self: None, raising=False)
    return worker, model


def test_zeroing_a_saved_buffer_is_a_level2_wake_up_that_restores_nothing_for_it(monkeypatch):
    import pytest
    import torch

    from harness.worker.extension import RefitObserver
    from harness.worker.sleep_backup import zero_saved_buffer

    worker, model = _sleeping_vllm_worker(monkeypatch)
    worker.sleep(level=2)
    worker.wake_up(tags=["weights"])
    assert torch.equal(model.rotary_emb.cos_sin_cache, torch.arange(8.0))  # vLLM restored it
    worker.sleep(level=2)
    assert RefitObserver.refit_harness_zero_sleep_saved_buffer(worker) == "rotary_emb.cos_sin_cache"
    worker.wake_up(tags=["weights"])
    assert torch.equal(model.rotary_emb.cos_sin_cache, torch.zeros(8))
    assert torch.equal(model.positions, torch.arange(4))  # only the chosen entry
    with pytest.raises(LookupError, match="not asleep at level 2"):
        zero_saved_buffer({})  # awake (or asleep at level 1): nothing saved, the twin must not pass silently
    assert zero_saved_buffer({"a": torch.arange(3), "b": torch.ones(2)}) == "b"  # no rotary cache: a float one


# ---- the rest: m2n's NCCL library, cpu tests on a CUDA host, V2 graphs, the hold ----------------


def _nccl_wheel(monkeypatch, tmp_path, version: str | None):
    """One nvidia-nccl-cu12 wheel of ``version`` (None: none) as importlib.metadata sees it."""
    import importlib.metadata
    import types

    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"")
    real = importlib.metadata.distribution

    def distribution(name):
        if name == "nvidia-nccl-cu12" and version:
            file = types.SimpleNamespace(name=lib.name, locate=lambda: lib)
            return types.SimpleNamespace(version=version, files=[file])
        if name.startswith("nvidia-nccl-"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    return str(lib)


def test_m2n_needs_a_new_enough_nccl_and_vllm_pointed_at_it(monkeypatch, tmp_path):
    """libnccl_m2n is linked against NCCL >= 2.30.5, and vLLM must load that same library
    (VLLM_NCCL_SO_PATH); the preflight names the library to point it at."""
    from harness.paths.weight_transfer import nccl_library_problem

    assert nccl_library_problem("nccl", {}) is None  # backends that link no NCCL library of their own
    _nccl_wheel(monkeypatch, tmp_path, None)
    assert "no NCCL wheel" in (nccl_library_problem("nccl_m2n", {}) or "")
    _nccl_wheel(monkeypatch, tmp_path, "2.28.9")
    assert "NCCL >= 2.30.5" in (nccl_library_problem("nccl_m2n", {}) or "")
    lib = _nccl_wheel(monkeypatch, tmp_path, "2.30.7")
    unset = nccl_library_problem("nccl_m2n", {}) or ""
    assert "VLLM_NCCL_SO_PATH is not set" in unset and f"VLLM_NCCL_SO_PATH={lib}" in unset, unset
    assert "does not exist" in (nccl_library_problem("nccl_m2n", {"VLLM_NCCL_SO_PATH": "/nope.so"}) or "")
    assert nccl_library_problem("nccl_m2n", {"VLLM_NCCL_SO_PATH": lib}) is None


def test_the_preflight_fails_m2n_on_a_wrong_nccl_library_where_its_package_is_installed(monkeypatch, tmp_path):
    import harness.paths.weight_transfer as wt
    from harness.arm.preflight import missing_package_findings
    from harness.plan import PreflightArm, PreflightCell, PreflightRequest
    from harness.spec.requirements import EngineRequirements

    m2n = EngineRequirements(kind="ray_llm", weight_transfer_backend="nccl_m2n")
    subject = next(a for a in shaped_plan({"m2n": m2n}).arms if a.role == "subject")
    cell = PreflightCell(id="g", gpus=2, arms=(PreflightArm(subject, 2.0),), skipped=())
    request = PreflightRequest(scenario="s", cells=(cell,))
    monkeypatch.setattr(wt, "missing_packages", lambda backend: [])
    lib = _nccl_wheel(monkeypatch, tmp_path, "2.30.7")
    monkeypatch.delenv("VLLM_NCCL_SO_PATH", raising=False)
    found = missing_package_findings(request)
    assert [(f.kind, f.cell) for f in found] == [("problem", "transfer_nccl_m2n")], found
    monkeypatch.setenv("VLLM_NCCL_SO_PATH", lib)
    assert [f.kind for f in missing_package_findings(request)] == ["ok"]


def test_cpu_engine_tests_are_skipped_on_a_cuda_host_and_gpu_tests_elsewhere():
    """``make test`` on a GPU host ran every ``cpu``-marked engine test against CUDA vLLM with the
    CPU backend's expectations; they are now skipped there with the reason."""
    from harness.orchestrate.pytest_plugin import CPU_EXPECTATIONS, NO_GPU, device_skip

    assert device_skip({"cpu": True}, cuda=True) == CPU_EXPECTATIONS
    assert device_skip({"gpu": True}, cuda=True) is None
    assert device_skip({"gpu": True}, cuda=False) == NO_GPU
    assert device_skip({"cpu": True}, cuda=False) is None
    assert device_skip({}, cuda=True) is None  # unit tests run everywhere


def test_v2_full_graphs_are_counted_though_they_record_no_inputs():
    import types

    from harness.worker.graph_reads import full_graphs_without_inputs

    runner = types.SimpleNamespace(cudagraph_manager=types.SimpleNamespace(graphs={1: object(), 4: object()}))
    assert full_graphs_without_inputs(runner) == 2
    assert full_graphs_without_inputs(types.SimpleNamespace(cudagraph_manager=None)) == 0  # V1 runner, or eager
    assert full_graphs_without_inputs(None) == 0


def test_the_hold_keeps_the_old_storage_through_a_data_rebind():
    """``hold`` kept the Parameter objects: a refit that rebinds ``param.data`` on the same object
    moved it unseen and freed the old storage. Held aliases keep it, and the move shows."""
    import torch

    from harness.worker.graph_reads import hold, moved

    p = torch.nn.Parameter(torch.ones(4))
    old = p.data_ptr()
    held = hold([("w", p)])
    p.data = torch.zeros(4)
    assert moved(held, {"w": p}) == ["w"]
    assert held["w"].data_ptr() == old and torch.equal(held["w"], torch.ones(4))


def test_the_fp16_sinks_issue_is_expected_only_of_models_that_have_sinks():
    """Measured on the zoo in fp16: models without sinks pass, so the issue must not apply to them
    (it did, and every dense family without sinks was an XPASS)."""
    sinks = next(i for i in KNOWN_ISSUES if "copy of the sinks" in i.title)
    for arch, expected in (("GraniteForCausalLM", True), ("Qwen3ForCausalLM", False), ("LlamaForCausalLM", False)):
        got = sinks.applies("reload_weights", Subject("cpu (x86_64)", "0.32.0", arch, dtype="float16"))
        assert got is expected, arch
    assert not sinks.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "GraniteForCausalLM", dtype="bfloat16")
    )
    assert not sinks.applies("sharded_state", Subject("cpu (x86_64)", "0.32.0", "GraniteForCausalLM", dtype="float16"))
