"""LoRA subjects get cold LoRA engines of their own kind; adapters are the A, B, B' of an
``adapter`` engine; an adapter tensor is localized under the base weight it adapts."""

from __future__ import annotations

import json

import pytest

from harness.plan import PathNeeds, lora_noise_name, lora_reference_name, make_plan
from harness.spec.checkpoint_set import CheckpointSet, adapted_weight
from harness.spec.requirements import EngineRequirements
from harness.spec.run import RunSpec

CS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
ADAPTERS = CheckpointSet(a="/la", b="/lb", b_control="/lc", control_tensor="base_model.model.x.q_proj.lora_A.weight")
T = ("B", "B", "B_control", "A")
NEEDS = {
    "plain": PathNeeds(EngineRequirements(), T),
    "lora_inplace": PathNeeds(EngineRequirements(lora="adapter"), T),
    "lora_base_reload": PathNeeds(EngineRequirements(lora="base"), T),
}


def test_only_lora_paths_start_only_lora_references():
    plan = make_plan(RunSpec(model="/a", paths=("lora_inplace",)), CS, NEEDS, {}, ADAPTERS)
    names = [a.name for a in plan.arms]
    assert names == [lora_reference_name("adapter"), lora_noise_name("adapter"), "subject-lora_inplace"]
    ref = plan.arms[0]
    assert (ref.role, ref.start, ref.requirements.lora) == ("lora_reference", "B", "adapter")
    assert ref.refit_checkpoints is ADAPTERS and ref.checkpoints is CS


def test_each_lora_role_gets_its_pair_beside_the_plain_one():
    plan = make_plan(RunSpec(model="/a", paths=tuple(NEEDS)), CS, NEEDS, {}, ADAPTERS)
    roles = [(a.name, a.role) for a in plan.arms if a.role != "subject"]
    assert ("reference", "reference") in roles and ("noise", "noise") in roles
    for role in ("adapter", "base"):
        assert (lora_reference_name(role), "lora_reference") in roles and (lora_noise_name(role), "lora_noise") in roles
    base = next(a for a in plan.arms if a.name == "subject-lora_base_reload")
    assert base.refit_checkpoints is CS  # a base engine refits the base weights


@pytest.mark.parametrize(
    "adapter, weight",
    [
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", "model.layers.1.mlp.down_proj.weight"),
        ("model.norm.weight", "model.norm.weight"),
    ],
)
def test_an_adapter_tensor_is_localized_under_the_weight_it_adapts(adapter, weight):
    assert adapted_weight(adapter) == weight


def test_the_harness_adapter_is_deterministic_and_targets_every_linear(tmp_path):
    from harness.checkpoints.lora import RANK, default_adapter
    from harness.checkpoints.read import read_headers
    from harness.checkpoints.tiny import tiny_qwen3

    model = tiny_qwen3(cache=tmp_path)
    one, two = default_adapter(model, cache=tmp_path), default_adapter(model, cache=tmp_path / "other")
    assert (one / "adapter_model.safetensors").read_bytes() == (two / "adapter_model.safetensors").read_bytes()
    headers = read_headers(one)
    base = read_headers(model)
    linears = [n for n in base if n.split(".")[-2].endswith("_proj") and len(base[n].shape) == 2]
    assert len(headers) == 2 * len(linears) and linears
    for name in linears:
        a = headers["base_model.model." + name.removesuffix(".weight") + ".lora_A.weight"]
        assert a.shape == (RANK, base[name].shape[1]) and a.dtype == base[name].dtype
    assert json.loads((one / "adapter_config.json").read_text())["r"] == RANK


def test_lora_max_rank_is_the_smallest_vllm_accepts_and_none_above_its_largest():
    """One source for the engine's ``max_lora_rank``, checked against vLLM's own list: above
    512 vLLM refuses the engine, so the harness says so instead of passing the rank through."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    from harness.errors import CheckpointError
    from harness.spec.checkpoint_set import MAX_LORA_RANKS, lora_max_rank

    assert MAX_LORA_RANKS == get_args(MaxLoRARanks)
    assert [lora_max_rank(r) for r in (1, 2, 8, 9, 320, 321, 512)] == [1, 8, 8, 16, 320, 512, 512]
    with pytest.raises(CheckpointError, match=r"rank 513 is above vLLM's largest max_lora_rank \(512\)"):
        lora_max_rank(513)
