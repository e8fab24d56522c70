"""Issue 20: the GPU nightly's weight-transfer cells, checked on the CPU against the installed
vLLM's own classes and validation (imports vLLM and, for placement, starts a CPU Ray told it has
GPUs; no engine). One test per defect the review found; each failed on the code before the fix
(``docs/gpu-nightly.md`` lists how)."""

from __future__ import annotations

import dataclasses
import json
import threading
import types
from pathlib import Path
from unittest import mock

import pytest
import tomllib

from harness.paths import PATHS
from harness.spec.checkpoint_set import CheckpointSet

ROOT = Path(__file__).resolve().parents[2]
W = "vllm.distributed.weight_transfer."
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
"""Qwen3-0.6B's config (the nightly's model), the parts vLLM's config checks read."""


class Reached(Exception):
    """Raised in place of a backend's first transport call (NCCL rendezvous, Ray actors)."""


class RecordingClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol, recording the init payload."""

    def __init__(self) -> None:
        self.init_info = None
        self.called = threading.Event()

    def init_weight_transfer_engine(self, init_info) -> None:
        self.init_info = init_info
        self.called.set()

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info) -> None: ...

    def finish_weight_update(self, weight_version=None) -> None: ...


# The first stand-in waits for Ray to start a worker process, which took over 10 s on a 2-core
# CI machine busy with the other xdist worker's engine; a placement that succeeds returns at its
# last arrival, so only one that fails pays this wait.
PLACED_WITHIN_S = 120


def stop(*args, **kwargs):
    raise Reached()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> CheckpointSet:
    """Two small bf16 checkpoints with twelve layers, in file order (``layers.10`` before ``layers.2``)."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("ckpt")
    names = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{part}" for i in range(12) for part in ("input_layernorm.weight", "mlp.up_proj.weight")
    ]
    for label, value in (("a", 0.0), ("b", 1.0)):
        (root / label).mkdir()
        tensors = {
            n: torch.full((4, 4) if "proj" in n or "embed" in n else (4,), value, dtype=torch.bfloat16) for n in names
        }
        tensors["model.layers.3.mlp.up_proj.weight"][0, 1] = value + 0.5
        save_file(tensors, str(root / label / "model.safetensors"))
        (root / label / "config.json").write_text(json.dumps(QWEN3_06B))
    a, b = str(root / "a"), str(root / "b")
    return CheckpointSet(a=a, b=b, b_control=b, control_tensor="model.layers.0.input_layernorm.weight")


def trainer(backend: str, checkpoints: CheckpointSet, world_size: int = 2):
    """The arm's own trainer rank 0, built as the arm builds it, with a recording client."""
    from harness.machinery.transfer import TrainerActor

    path = PATHS.get(f"transfer_{backend}")(checkpoints)
    actor = TrainerActor(None, path.trainer_fields(world_size), backend, checkpoints.a)
    actor.client = RecordingClient()
    return actor


def test_defect_1_sparse_nccl_trainer_is_given_no_weight_source(checkpoints):
    # vLLM: "Sparse NCCL weight transfer takes no WeightSource" (a ValueError before the fix).
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    actor = trainer("sparse_nccl", checkpoints)
    with mock.patch(W + "sparse_nccl_engine.open_trainer_endpoint", side_effect=stop), pytest.raises(Reached):
        actor.connect()
    NCCLWeightTransferInitInfo(**actor.client.init_info)  # the workers can parse what it sent


def test_defect_2_sparse_patches_pass_vllms_own_patch_validation(checkpoints):
    from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseNCCLTrainerWeightTransferEngine

    from harness.machinery.transfer import CheckpointSource, sparse_patches

    patches = sparse_patches(CheckpointSource(checkpoints.a), CheckpointSource(checkpoints.b))
    assert patches and {str(p.indices.dtype) for p in patches} == {"torch.int32"}
    for p in patches:
        SparseNCCLTrainerWeightTransferEngine._validate_patch(p)  # "require int32 indices" before the fix


def test_defect_3_m2n_trainer_gets_an_m2n_source_and_its_package_is_declared(checkpoints, monkeypatch):
    from vllm.distributed.weight_transfer.m2n_engine import M2NWeightTransferInitInfo

    actor = trainer("nccl_m2n", checkpoints)
    with (
        mock.patch(W + "m2n_trainer.import_m2n", return_value=types.SimpleNamespace()),
        mock.patch(W + "m2n_trainer.trainer_init", side_effect=stop),
        pytest.raises(Reached),
    ):
        actor.connect()  # a TypeError ("must be an M2NWeightSource") before the fix
    assert actor.client.called.wait(5)
    M2NWeightTransferInitInfo(**actor.client.init_info)  # mesh, placements and plan parse worker-side
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("nccl-extensions") for d in extras["gpu-full"])
    monkeypatch.setenv("HARNESS_DEVICE", "gpu")
    monkeypatch.setattr(
        "importlib.metadata.version", mock.Mock(side_effect=__import__("importlib").metadata.PackageNotFoundError)
    )
    reason = PATHS.get("transfer_nccl_m2n").unavailable_reason()
    assert reason and "nccl-extensions" in reason and "gpu-full" in reason


def test_defect_4_sharded_rdt_runs_on_a_ray_executor_with_a_layer_ordered_source(checkpoints, monkeypatch):
    import torch
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.sharded_rdt_engine import ShardedRDTWeightTransferEngine
    from vllm.engine.arg_utils import EngineArgs

    from harness.arm.engines import _llm_kwargs
    from harness.plan import PathNeeds, make_plan
    from harness.spec.run import EngineSpec, RunSpec

    monkeypatch.setenv("HARNESS_DEVICE", "gpu")
    spec = RunSpec(model=checkpoints.a, paths=("transfer_sharded_rdt",), engine=EngineSpec(dtype="bfloat16"))
    needs = {"transfer_sharded_rdt": PathNeeds.of(PATHS.get("transfer_sharded_rdt"))}
    arm = next(a for a in make_plan(spec, checkpoints, needs, {}).arms if a.role == "subject")
    config = EngineArgs(**_llm_kwargs(arm, None)).create_engine_config()
    # vLLM's own check: "requires distributed_executor_backend='ray', got 'mp'" before the fix.
    ShardedRDTWeightTransferEngine(
        WeightTransferConfig(backend="sharded_rdt"), config, torch.device("cpu"), torch.nn.Module()
    )
    actor = trainer("sharded_rdt", checkpoints)
    target = W + "sharded_rdt_trainer.ShardedRDTTrainerWeightTransferEngine._spawn_server"
    with mock.patch(target, side_effect=stop), pytest.raises(Reached):
        actor.connect()  # "metadata order is group-contiguous" (layers.10 before layers.2) before the fix


def test_defect_5_trainers_are_placed_where_the_arm_has_room(ray_gpus):
    """The arm holds the trainer's GPU beside the engine's, and the trainer is placed in the Ray
    the arm starts (which sees only the arm's GPUs); the gloo twin asks for no GPU."""
    from harness.arm.preflight import _place_inside
    from harness.spec.transfer import arm_gpus, layout

    ray, hold, gate = ray_gpus
    for backend, tp in (("nccl", 1), ("nccl", 2), ("sparse_nccl", 1), ("nccl_m2n", 2), ("sharded_rdt", 2)):
        placed = layout(backend, tp, cuda=True)
        assert arm_gpus(tp, backend) == tp + 1  # the old arms held tp: the trainer never started
        with _free(ray, placed.arm_gpus):
            found = _place_inside(ray, hold, gate, placed, placed.arm_gpus, backend, timeout=PLACED_WITHIN_S)
        assert found.kind == "ok", found.line()
    gloo = layout("gloo", 2, cuda=True)
    assert gloo.arm_gpus == 2 and [t.gpus for t in gloo.trainers] == [0.0]


def test_http_weight_transfer_counts_its_nccl_trainers_gpu():
    """The RL HTTP path (merged from main) runs vLLM's NCCL trainer on a GPU of its own beside
    the server's workers: a machine without that GPU SKIPS the cell with the reason instead of
    an arm Ray can never place (defect 5's hang)."""
    from harness.orchestrate.resolve import unavailable_paths

    http = {"http_weight_transfer": PATHS.get("http_weight_transfer")}
    assert [http["http_weight_transfer"].gpus_needed(tp) for tp in (1, 2)] == [2, 3]
    skipped = unavailable_paths(http, 2, 2, cuda=True, packages=False)
    assert "needs 3 GPUs here (TP 2 and a trainer GPU of its own)" in skipped["http_weight_transfer"]
    assert unavailable_paths(http, 2, 3, cuda=True, packages=False) == {}


def test_defect_6_ipc_has_a_colocated_sender_on_each_worker_gpu(ray_gpus):
    from harness.arm.preflight import place_together
    from harness.machinery.placement import engine_placement_group, trainer_actor_options, worker_actor_options
    from harness.spec.transfer import layout

    ray, hold, gate = ray_gpus
    placed = layout("ipc", 2, cuda=True)
    assert placed.arm_gpus == 2 and [t.bundle for t in placed.trainers] == [0, 1]
    with _free(ray, 2):
        pg = engine_placement_group(ray, placed, timeout_s=PLACED_WITHIN_S)
        try:
            asks = {f"worker {r}": worker_actor_options(placed, pg, r) for r in range(2)}
            asks |= {f"trainer {t.rank}": trainer_actor_options(t, pg) for t in placed.trainers}
            got = place_together(ray, hold, gate, asks, timeout_s=PLACED_WITHIN_S)
        finally:
            ray.util.remove_placement_group(pg)
    assert isinstance(got, dict), got
    assert got["trainer 0"] == got["worker 0"] and got["trainer 1"] == got["worker 1"]
    assert got["worker 0"] != got["worker 1"]  # each handle is keyed by its own GPU's UUID


def test_defect_7_nightly_kv_cache_fits_in_bf16_on_the_production_backend(tmp_path):
    from scenarios import SCENARIOS

    nightly = SCENARIOS.get("gpu-nightly")()
    assert nightly.dtypes == ("bfloat16",) and set(nightly.modes) == {"eager", "compiled"}  # was float32
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from harness.arm.engines import engine_args
    from harness.arm.preflight import check_kv_cache, engine_config
    from harness.orchestrate.resolve import resolve_engine
    from harness.plan import PathNeeds, make_plan
    from harness.spec.scenario import expand

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    cs = CheckpointSet(a=str(tmp_path), b=str(tmp_path), b_control=str(tmp_path), control_tensor="x")
    groups = [g for g in expand(nightly) if g.model.label == "Qwen3-0.6B"]  # the HPC cell is its own model's
    assert len(groups) == 8  # plain and drafter, eager and compiled, TP 1 and 2
    for group in groups:
        spec = resolve_engine(
            dataclasses.replace(group.spec, model=str(tmp_path), paths=("reload_weights",)), str(tmp_path)
        )
        arm = make_plan(spec, cs, {"reload_weights": PathNeeds.of(PATHS.get("reload_weights"))}, {}).arms[0]
        kwargs = engine_args(arm)
        found = check_kv_cache(arm, engine_config(kwargs), kwargs, group.id)  # vLLM's own check
        assert [f.kind for f in found] == ["ok"], found
        backend = AttentionBackendEnum[spec.engine.vllm_kwargs()["attention_backend"]].get_class()
        reasons = backend.validate_configuration(
            head_size=128,
            dtype=getattr(torch, spec.engine.dtype),
            kv_cache_dtype="auto",
            block_size=16,
            use_mla=False,
            has_sink=False,
            use_sparse=False,
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=DeviceCapability(9, 0),
            attn_type="decoder",
        )
        assert backend.get_name() == "FLASH_ATTN" and reasons == []


def test_defect_8_a_rebound_tensor_fails_under_cuda_graphs_unless_shown_unread():
    """The recorded forward never saw ``w`` (a graph replay dispatches nothing), so it must not
    excuse its moved address; shown unread by the captured graphs, it does not fail."""
    from harness.judge.diff import PathComparison, TensorDiff, TensorStatus
    from harness.judge.verdict import VerdictStatus, judge
    from harness.spec.run import JudgePolicy

    tensors = (
        TensorDiff(
            check="refit",
            tensor="w",
            kind="parameter",
            status=TensorStatus.REBOUND,
            subject_digest="d",
            reference_digest="d",
            witness_digest="e",
            address_moved=True,
        ),
    )
    consumed = _consumed_ok("x")
    moved = PathComparison(
        path="compiled", tensors=tensors, tokens=(), control=None, errors=(), missing_observations=(), consumed=consumed
    )
    assert judge(moved, JudgePolicy(), fail_on_rebound=True).status is VerdictStatus.FAIL
    from harness.judge.diff import GraphReadOutcome

    shown = dataclasses.replace(
        moved, graphs_probed=True, graph_reads=(GraphReadOutcome("w", "unread", "poisoning changed nothing"),)
    )
    assert judge(shown, JudgePolicy(), fail_on_rebound=True, graphs=True).status is not VerdictStatus.FAIL
    read = dataclasses.replace(shown, graph_reads=(GraphReadOutcome("w", "read", "a captured input"),))
    verdict = judge(read, JudgePolicy(), fail_on_rebound=True, graphs=True)
    assert verdict.status is VerdictStatus.FAIL and any("captured" in r for r in verdict.reasons)


def test_defect_8_the_recorded_forward_has_a_decode_step_inside_the_captured_sizes():
    from harness.arm.process import observe
    from harness.records import ObservationLabel, PromptOutput

    engine = FakeEngine()
    observe(engine, _arm(), ObservationLabel("warm_B", "reload_weights"))
    recorded = engine.generated[: engine.generated.index("stop")]
    # vLLM captures graphs up to min(2 * max_num_seqs, 512) = 16 tokens for 8 sequences.
    small = [p for p in recorded if p != "start" and len(p.token_ids) > 1 and sum(map(len, p.token_ids)) <= 16]
    assert small and small[0].max_tokens >= 2, recorded  # a decode step of several sequences
    assert PromptOutput  # used by the fake engine


def test_defect_9_ipc_handles_pass_vllms_msgpack_to_a_separate_engine_core(monkeypatch):
    import torch
    from vllm.v1.serial_utils import MsgpackEncoder

    from harness.machinery.placement import engine_actor_options
    from harness.spec.transfer import layout

    args = (
        torch.Tensor,
        torch.Size([2]),
        (1,),
        0,
        torch.UntypedStorage,
        torch.bfloat16,
        0,
        b"h",
        4,
        0,
        False,
        b"r",
        0,
        b"e",
        True,
    )  # what reduce_tensor puts in a CUDA tensor's handle
    payload = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]], "ipc_handles": [{"GPU-0": args}]}
    message = ("collective_rpc", ("update_weights",), {"update_info": payload})
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(TypeError, match="not serializable"):
        MsgpackEncoder().encode(message)  # what the engine core refused before the fix
    env = engine_actor_options(layout("ipc", 1, cuda=True), None)["runtime_env"]["env_vars"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert MsgpackEncoder().encode(message)


def test_defect_10_the_sleep_twin_breaks_the_restore_not_the_reload():
    engine = RecordingEngine()
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="model.layers.0.input_layernorm.weight")
    PATHS.get("sleep_level1")(cs).sabotaged_refit(engine, "B")
    assert engine.calls == [
        ("rpc", "reload_weights", {"weights_path": "/b"}),
        ("call", "sleep", {"level": 1}),
        ("rpc", "refit_harness_zero_sleep_backup", {"names": [cs.control_tensor]}),
        ("call", "wake_up", {}),
    ]
    import torch
    from vllm.device_allocator import AllocationData

    from harness.worker.sleep_backup import zero_in_backups

    backup = torch.arange(1, 65, dtype=torch.uint8)
    alloc = {4096: AllocationData(handle=(0, 64, 4096, 0), tag="weights", cpu_backup_tensor=backup, is_asleep=True)}
    assert zero_in_backups(alloc, 4096 + 8, 16) == 16
    assert backup[8:24].tolist() == [0] * 16 and backup[:8].tolist() == list(range(1, 9))
    with pytest.raises(LookupError):
        zero_in_backups(alloc, 4096 + 60, 16)  # not all of it in sleep-mode memory
    alloc[4096].cpu_backup_tensor = None
    with pytest.raises(LookupError):
        zero_in_backups(alloc, 4096, 4)  # not offloaded: the twin must not pass silently


def test_defect_11_the_nightly_workflow_may_write_checks_and_runs_the_preflight():
    import yaml

    flow = yaml.safe_load((ROOT / ".github/workflows/gpu-nightly.yml").read_text())
    job = flow["jobs"]["gpu-nightly"]
    assert (flow.get("permissions") or job.get("permissions") or {}).get("checks") == "write"
    assert any("preflight -s gpu-nightly" in (s.get("run") or "") for s in job["steps"])


# ---- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_gpus():
    """A CPU Ray told it has 4 GPUs, and the preflight's stand-in task and gate."""
    import ray

    from harness.arm.preflight import Gate, _hold
    from harness.ray_local import init_local_ray

    init_local_ray(ray, num_cpus=2, num_gpus=4, log_to_driver=False, object_store_memory=128 << 20)
    try:
        yield ray, ray.remote(num_cpus=0)(_hold), ray.remote(num_cpus=0)(Gate).remote()
    finally:
        ray.shutdown()


def _free(ray, gpus: float):
    from harness.arm.preflight import leaving_free

    return leaving_free(ray, 4, gpus, PLACED_WITHIN_S)


def _consumed_ok(name: str):
    from harness.judge.diff import ConsumedDiff, TensorStatus

    return (ConsumedDiff(op_index=0, op="aten.mm", arg=1, module="m", tensor=name, status=TensorStatus.OK),)


def _arm():
    from harness.plan import ArmPlan
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import EngineSpec, PromptSpec

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="w")
    return ArmPlan(
        name="subject",
        role="subject",
        paths=("reload_weights",),
        start="A",
        steps=(),
        engine=EngineSpec(),
        requirements=EngineRequirements(),
        prompts=PromptSpec(token_ids=(tuple(range(1, 280)),)),
        checkpoints=cs,
        timeout_s=60,
    )


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list = []

    def rpc(self, method, kwargs=None):
        self.calls.append(("rpc", method, kwargs or {}))
        return [None]

    def call(self, method, *args, **kwargs):
        self.calls.append(("call", method, kwargs))

    def generate(self, prompts):
        self.calls.append(("generate", prompts))
        return ()


class FakeEngine:
    """Answers the observation's RPCs with empty records; logs generate calls between the
    recorder's start and stop."""

    def __init__(self) -> None:
        self.generated: list = []

    def rpc(self, method, kwargs=None):
        from harness import store
        from harness.records import RankCensus, RankRecording

        if method == "refit_harness_census":
            return [store.to_jsonable(RankCensus(0, (), (), "M", (), (), ()))]
        if method == "refit_harness_recorder_start":
            self.generated.append("start")
            return [None]
        if method == "refit_harness_recorder_stop":
            self.generated.append("stop")
            return [store.to_jsonable(RankRecording(0, (), ()))]
        return [None]

    def generate(self, prompts):
        from harness.records import PromptOutput

        self.generated.append(prompts)
        return tuple(
            PromptOutput(prompt=i, token_ids=(1,) * prompts.max_tokens, logprobs=())
            for i in range(len(prompts.token_ids))
        )

    def call(self, method, *args, **kwargs):
        return None

    def draft_counts(self):
        return None


def test_the_nightly_has_a_drafter_cell_on_its_main_model_with_level_2_sleep(tmp_path):
    """Issue 35: a drafter left at A after a refit, and its weights lost by level-2 sleep (vllm
    #52487), on the GPU: the main model's cells again with a drafter; the preflight builds their
    engine configuration, the drafter's included."""
    from harness.arm.engines import engine_args
    from harness.arm.preflight import engine_config
    from harness.plan import PathNeeds, make_plan
    from harness.spec.scenario import expand
    from scenarios import SCENARIOS
    from scenarios.gpu_nightly import DRAFTER_PATHS

    groups = expand(SCENARIOS.get("gpu-nightly")())
    drafted = [g for g in groups if "-drafter-" in g.id]
    assert drafted and {g.model.label for g in drafted} == {"Qwen3-0.6B"}, [g.id for g in drafted]
    assert all(g.spec.engine.draft_tokens == 2 and set(g.spec.paths) == set(DRAFTER_PATHS) for g in drafted)
    assert all("reload_weights_drafter" not in g.spec.paths for g in groups if g not in drafted)
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    cs = CheckpointSet(a=str(tmp_path), b=str(tmp_path), b_control=str(tmp_path), control_tensor="x")
    spec = dataclasses.replace(drafted[0].spec, model=str(tmp_path), paths=("reload_weights_drafter",))
    arm = make_plan(spec, cs, {"reload_weights_drafter": PathNeeds.of(PATHS.get("reload_weights_drafter"))}, {})
    kwargs = engine_args(arm.arms[0])
    assert kwargs["speculative_config"]["num_speculative_tokens"] == 2
    assert engine_config(kwargs).speculative_config is not None  # what the preflight builds
