"""The GPU weight-transfer paths cannot run here, but what they hand to vLLM can be built
here: every backend's real dataclasses, from the installed vLLM (imports vLLM, no engine)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.paths import PATHS
from harness.paths.weight_transfer import WeightTransferPath
from harness.spec.checkpoint_set import CheckpointSet

CUDA_BACKENDS = ("nccl", "ipc", "sparse_nccl", "sharded_rdt", "nccl_m2n")
CHECKPOINTS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x.weight")


def transfer_path(backend: str) -> WeightTransferPath:
    return PATHS.get(f"transfer_{backend}")(CHECKPOINTS)


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_trainer_init_info_is_the_backends_own_dataclass_with_the_fields_we_send(backend):
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from harness.machinery.transfer import trainer_init_info

    fields = transfer_path(backend).trainer_fields(world_size=3)
    info = trainer_init_info(backend, fields)  # a missing or misnamed field raises TypeError here
    expected_cls = WeightTransferTrainerFactory._registry[backend]().init_info_cls
    assert type(info) is expected_cls and info.backend == backend and info.is_sender
    declared = {f.name for f in dataclasses.fields(expected_cls)}
    assert set(fields) <= declared


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_engine_side_dataclasses_exist_for_every_backend(backend):
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    engine_cls = WeightTransferEngineFactory._registry[backend]()
    assert dataclasses.is_dataclass(engine_cls.init_info_cls) and dataclasses.is_dataclass(engine_cls.update_info_cls)


def test_the_gloo_twin_speaks_the_nccl_backends_update_format():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from harness.machinery.transfer import GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo

    nccl = WeightTransferEngineFactory._registry["nccl"]()
    names = lambda cls: [f.name for f in dataclasses.fields(cls)]  # noqa: E731
    # The twin's payload is one the NCCL engine accepts: its fields, in order; any field NCCL has
    # beyond them has a default (0.34 added ``src``, the sending rank, defaulted to 0).
    ours = names(GlooWeightTransferUpdateInfo)
    assert names(nccl.update_info_cls)[: len(ours)] == ours
    extra = [f for f in dataclasses.fields(nccl.update_info_cls) if f.name not in ours]
    assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING for f in extra)
    assert set(names(GlooWeightTransferInitInfo)) <= set(names(nccl.init_info_cls))


def test_sparse_patches_are_vllms_own_and_skip_left_out_tensors(tmp_path):
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseWeightPatch

    from harness.machinery.transfer import CheckpointSource, sparse_patches
    from harness.worker import vllm_compat

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_file({"w": torch.zeros(2, 3), "n": torch.ones(3)}, str(tmp_path / "a" / "model.safetensors"))
    save_file(
        {"w": torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 7.0]]), "n": torch.full((3,), 2.0)},
        str(tmp_path / "b" / "model.safetensors"),
    )
    held = CheckpointSource(tmp_path / "a")
    patches = sparse_patches(held, CheckpointSource(tmp_path / "b"))
    assert all(type(p) is SparseWeightPatch for p in patches)
    w = next(p for p in patches if p.name == "w")
    assert w.indices.tolist() == [1, 5] and w.values.tolist() == [5.0, 7.0] and w.full_shape == (2, 3)
    left_out = sparse_patches(held, CheckpointSource(tmp_path / "b", exclude=("n",)))
    assert [p.name for p in left_out] == ["w"]
    source = CheckpointSource(tmp_path / "b", exclude=("n",))
    assert [m.name for m in vllm_compat.source_metadata(source)] == ["w"]


def test_cuda_backends_hand_over_cuda_tensors():
    from harness.machinery.transfer import source_device

    assert {b: source_device(b) for b in CUDA_BACKENDS} == dict.fromkeys(CUDA_BACKENDS, "cuda")
    assert source_device("gloo") == "cpu"


def test_sources_follow_each_backends_order_type_and_sabotage(tmp_path):
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.weight_transfer.base import layerwise_groups

    from harness.machinery.transfer import checkpoint_source, trainer_source
    from harness.worker import vllm_compat

    names = ["model.embed_tokens.weight", "model.norm.weight"] + [f"model.layers.{i}.w" for i in (0, 1, 2, 10, 11)]
    for label, value in (("a", 0.0), ("b", 1.0)):
        (tmp_path / label).mkdir()
        save_file({n: torch.full((2,), value) for n in names}, str(tmp_path / label / "model.safetensors"))
    rdt = checkpoint_source("sharded_rdt", tmp_path / "b", device="cpu")
    order = [m.name for m in vllm_compat.source_metadata(rdt)]
    assert order == [n for g in layerwise_groups(order) for n in g] and order.index("model.layers.2.w") < order.index(
        "model.layers.10.w"
    )
    # iteration agrees with metadata, element for element
    assert [n for n, _ in vllm_compat.source_tensors(rdt)] == order
    m2n = checkpoint_source("nccl_m2n", tmp_path / "b", device="cpu")
    if vllm_compat.locate("M2NWeightSource"):  # before 0.33: an M2NWeightSource, every tensor REPLICATED
        from vllm.distributed.weight_transfer.m2n_common import REPLICATED

        assert isinstance(m2n, vllm_compat.resolve("M2NWeightSource")) and m2n.mesh().dims == (1, 1)
        assert {m.placements for m in m2n.metadata()} == {REPLICATED}
    else:  # 0.33+: any source with iter_local; one rank owns every tensor whole
        assert m2n.implements_iter_local() and {m.owners for m in m2n.metadata} == {None}
        assert list(m2n.iter_local()) and [n for n, _ in m2n.iter_local()] == [m.name for m in m2n.metadata]
    sabotaged = dict(
        vllm_compat.source_tensors(
            checkpoint_source(
                "nccl_m2n", tmp_path / "b", device="cpu", substitute={"model.norm.weight": str(tmp_path / "a")}
            )
        )
    )
    assert sabotaged["model.norm.weight"].tolist() == [0.0, 0.0] and sabotaged["model.layers.0.w"].tolist() == [
        1.0,
        1.0,
    ]
    assert trainer_source("sparse_nccl", tmp_path / "b") is None


def test_the_gloo_twin_moves_float8_tensors_as_their_bytes():
    """gloo has no float8 type ("Invalid scalar type": the fp8 W8A8 checkpoint's gloo and HTTP
    transfer cells were ERROR). The twin's broadcast sends and receives them as uint8 views, so
    the receiver's float8 tensor holds the sender's bytes; other dtypes go as they are."""
    import threading

    import torch

    from harness.machinery.transfer import _broadcast, _gloo_group, store_listener

    listen = store_listener("127.0.0.1")
    port = listen.getsockname()[1]
    sent = {
        "fp8": torch.linspace(-2, 2, 24).reshape(4, 6).to(torch.float8_e4m3fn),
        "bf16": torch.linspace(-1, 1, 8).to(torch.bfloat16),
    }
    got = {name: torch.zeros_like(t) for name, t in sent.items()}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = _gloo_group("127.0.0.1", port, r, 2, listen if r == 0 else None)
            for name in sent:
                _broadcast(group, sent[name] if r == 0 else got[name])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for name, t in sent.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
