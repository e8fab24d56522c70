"""The engine configurations the scenarios ship: the zoo's tied-embedding and fp8-KV families,
and the gpu-nightly HPC QK-norm cell, checked on the CPU as far as a CPU can (engine-free)."""

from __future__ import annotations

import json

import pytest

from harness.spec.engine_config import EngineConfig, check_engine_args, encode
from harness.spec.scenario import ModelRef, ScenarioSpec, expand


def test_the_hpc_cell_is_a_hunyuan_on_hpc_attn_whose_arguments_this_vllm_takes(monkeypatch):
    from harness.builds.engine_fields import engine_fields
    from harness.settings import NIGHTLY_ATTENTION_ENV
    from scenarios.gpu_nightly import HPC_ATTN, gpu_nightly

    monkeypatch.delenv(NIGHTLY_ATTENTION_ENV, raising=False)
    groups = {g.id: g for g in expand(gpu_nightly())}
    hpc = [g for g in groups.values() if "-hpc-" in g.id]
    assert hpc and all(g.model.label == "hunyuan-v3" for g in hpc)
    assert all(g.spec.engine.vllm_kwargs() == {"attention_backend": "HPC_ATTN"} for g in hpc)
    assert all(g.spec.requires_device == ("sm90",) and g.spec.expected_census == HPC_ATTN.expect_census for g in hpc)
    # The nightly model pins only the production attention backend (issue 20: FLASH_ATTN by
    # default); the HunYuan runs only the HPC configuration.
    nightly = [g for g in groups.values() if g.model.label != "hunyuan-v3"]
    assert nightly and all(g.spec.engine.vllm_kwargs() == {"attention_backend": "FLASH_ATTN"} for g in nightly)
    for args in {HPC_ATTN.args, *(g.spec.engine.engine_args for g in nightly)}:
        check_engine_args(args, engine_fields())  # valid EngineArgs of the installed vLLM


def test_the_hpc_expected_census_names_both_forms_of_the_qk_norm_weights():
    import re

    from scenarios.gpu_nightly import HPC_QK_NORM, IHC_ALIASES

    before_fix = "model.layers.0.self_attn.hpc_rope_norm.qnorm_weight"  # the float32 mirror (vLLM < #56706)
    after_fix = "model.layers.0.self_attn.q_norm.weight"  # read directly since
    for name in (before_fix, after_fix, before_fix.replace("qnorm", "knorm"), after_fix.replace("q_norm", "k_norm")):
        assert any(re.search(p, name) for p in HPC_QK_NORM), name
    assert re.search(HPC_QK_NORM[2], "model.layers.1.self_attn.hpc_rope_norm.cos_sin_cache")
    assert not any(re.search(p, "model.layers.0.self_attn.q_proj.weight") for p in HPC_QK_NORM)
    assert re.search(IHC_ALIASES[0], "model.layers.3.hc_attn_layer.hc_pre.hc_fn.weight")
    assert re.search(IHC_ALIASES[3], "model.hc_head.hc_head_scale")


def test_a_cell_whose_expected_state_the_census_never_saw_is_not_a_pass():
    from harness.judge.verdict import Verdict, VerdictStatus, with_expected_census

    ok = Verdict("reload_weights", VerdictStatus.PASS, ())
    fell_back = {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"}
    patterns = (r"\.q_norm\.weight$", r"\.hpc_rope_norm\.cos_sin_cache$")
    got = with_expected_census(ok, patterns, fell_back)
    assert got.status is VerdictStatus.INCONCLUSIVE
    assert got.reasons[0].startswith(r"expected in the census but never observed: \.hpc_rope_norm\.cos_sin_cache$")
    assert (
        with_expected_census(ok, patterns, fell_back | {"model.layers.0.self_attn.hpc_rope_norm.cos_sin_cache"}) == ok
    )
    failed = Verdict("reload_weights", VerdictStatus.FAIL, ("x STALE",))
    assert with_expected_census(failed, patterns, fell_back).status is VerdictStatus.FAIL  # named, not hidden
    skipped = Verdict("reload_weights", VerdictStatus.SKIPPED, ("needs sm90",))
    assert with_expected_census(skipped, patterns, set()) == skipped


def test_a_configuration_for_another_device_is_skipped_with_its_reason(monkeypatch):
    from harness import device

    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert device.unmet(("sm90",)) == "needs sm90; this machine offers cpu"
    assert device.unmet(()) is None and device.unmet(("cpu", "sm90")) is None
    monkeypatch.setattr(device, "device_tags", lambda: frozenset({"cuda", "sm100"}))
    assert device.unmet(("sm90",)) == "needs sm90; this machine offers cuda, sm100"


def test_a_models_own_engine_arguments_go_under_the_configurations():
    s = ScenarioSpec(
        name="s",
        description="",
        models=(ModelRef("kv", path="/kv", engine_args=encode({"kv_cache_dtype": "fp8", "max_num_seqs": 2})),),
        paths=("reload_weights",),
        engine_configs=(EngineConfig(), EngineConfig("e5m2", encode({"kv_cache_dtype": "fp8_e5m2"}))),
    )
    got = {g.id: g.spec.engine.vllm_kwargs() for g in expand(s)}
    assert got == {
        "kv-eager-tp1": {"kv_cache_dtype": "fp8", "max_num_seqs": 2},
        "kv-e5m2-eager-tp1": {"kv_cache_dtype": "fp8_e5m2", "max_num_seqs": 2},
    }


def test_the_zoo_runs_tied_variants_of_the_dense_families_and_the_fp8_kv_family():
    from harness.checkpoints.zoo import FAMILIES, KV_FAMILIES, TIED_FAMILIES
    from scenarios.zoo import zoo

    dense = [f.label for f in FAMILIES if f.dense]
    assert dense == ["llama", "qwen3", "qwen2", "phi3", "gemma3"]
    assert [f.label for f in TIED_FAMILIES] == [f"{d}-tied" for d in dense]
    assert all(dict(f.config)["tie_word_embeddings"] is True for f in TIED_FAMILIES)
    models = {m.label: m for m in zoo().models}
    assert set(models) >= {f.label for f in TIED_FAMILIES + KV_FAMILIES}
    assert json.loads(dict(models["qwen3-fp8kv"].engine_args)["kv_cache_dtype"]) == "fp8"
    assert all(models[f.label].engine_args == () for f in FAMILIES + TIED_FAMILIES)


def test_the_zoo_drafts_with_the_attention_families_an_eagle_head_and_an_mtp_layer_on_the_drafter_paths_only():
    from harness.checkpoints.zoo import FAMILIES, VISION_FAMILIES
    from scenarios.zoo import DRAFTER_PATHS, SSM_FAMILIES, zoo

    groups = expand(zoo())
    drafted = {g.id: g.spec for g in groups if g.spec.engine.draft_tokens and g.spec.engine.drafter == "draft_model"}
    labels = {i.split("-drafter-")[0] for i in drafted}
    eagle = {g.id: g.spec for g in groups if g.spec.engine.drafter == "eagle"}
    # vLLM builds EAGLE heads for Llama-family targets: the zoo's Llama, in each dtype, on the same paths.
    assert {i.split("-eagle-")[0] for i in eagle} == {"llama"} and len(eagle) == len(zoo().dtypes)
    assert {(spec.paths, spec.engine.draft_tokens) for spec in eagle.values()} == {(DRAFTER_PATHS, 2)}
    # MiMo's and DeepSeek-V3's MTP layers draft one token a step, from the target's own checkpoint.
    mtp = {g.id: g.spec for g in groups if g.spec.engine.drafter == "mtp"}
    assert {i.rsplit("-mtp-", 1)[0] for i in mtp} == {"mimo", "deepseek-v3-mtp"}
    assert len(mtp) == 2 * len(zoo().dtypes)
    assert {(spec.paths, spec.engine.draft_tokens) for spec in mtp.values()} == {(DRAFTER_PATHS, 1)}
    # vLLM 0.32 cannot draft for a model with Mamba layers (a bare assertion): no SSM family.
    assert labels == {f.label for f in FAMILIES} - set(SSM_FAMILIES)
    assert not labels & {f.label for f in VISION_FAMILIES}  # vLLM cannot start an Idefics3 drafter
    assert set(SSM_FAMILIES) <= {f.label for f in FAMILIES}  # no stale label hides a family
    assert {spec.paths for spec in drafted.values()} == {DRAFTER_PATHS}
    assert {spec.engine.draft_tokens for spec in drafted.values()} == {2}
    # The other cells never run the drafter's path.
    assert not any("reload_weights_drafter" in g.spec.paths for g in groups if not g.spec.engine.draft_tokens)


@pytest.mark.parametrize("label", ["qwen3-tied", "gemma3-tied"])
def test_a_tied_checkpoint_has_no_lm_head_on_disk_and_its_b_moves_the_embedding(tmp_path, label):
    from harness.checkpoints.derived import perturbed
    from harness.checkpoints.read import read_headers
    from harness.checkpoints.zoo import tiny_model
    from harness.spec.run import PerturbSpec

    a = tiny_model(label, cache=tmp_path)
    assert json.loads((a / "config.json").read_text())["tie_word_embeddings"] is True
    headers = read_headers(a)
    assert "lm_head.weight" not in headers and "model.embed_tokens.weight" in headers
    b = perturbed(a, PerturbSpec(), cache=tmp_path)
    assert set(read_headers(b)) == set(headers)  # B does not invent a head the checkpoint does not have


def test_the_fp8_kv_checkpoint_carries_kv_scales_that_b_moves_and_keeps_positive(tmp_path):
    from safetensors.torch import load_file

    from harness.checkpoints.derived import perturbed
    from harness.checkpoints.zoo import tiny_model
    from harness.spec.run import PerturbSpec

    a = tiny_model("qwen3-fp8kv", cache=tmp_path)
    config = json.loads((a / "config.json").read_text())["quantization_config"]
    assert config["kv_cache_scheme"]["num_bits"] == 8 and config["config_groups"] == {}
    ta = load_file(a / "model.safetensors")
    tb = load_file(perturbed(a, PerturbSpec(), cache=tmp_path) / "model.safetensors")
    scales = [n for n in ta if n.endswith(("k_scale", "v_scale"))]
    assert len(scales) == 4 and all(ta[n].shape == () and str(ta[n].dtype) == "torch.float32" for n in scales)
    assert all(float(tb[n]) != float(ta[n]) and float(tb[n]) > 0 for n in scales)


def test_the_deepseek_v3_checkpoint_has_a_drawn_routing_bias_that_b_moves(tmp_path):
    """The routing bias transformers leaves at zero is drawn like a bias: a stale, a refreshed and a
    corrupted copy then all differ; config.json selects vLLM's noaux_tc router."""
    from safetensors.torch import load_file

    from harness.checkpoints.derived import perturbed
    from harness.checkpoints.zoo import tiny_model
    from harness.spec.run import PerturbSpec

    a = tiny_model("deepseek-v3", cache=tmp_path)
    config = json.loads((a / "config.json").read_text())
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")
    ta = load_file(a / "model.safetensors")
    tb = load_file(perturbed(a, PerturbSpec(), cache=tmp_path) / "model.safetensors")
    biases = [n for n in ta if n.endswith("mlp.gate.e_score_correction_bias")]
    assert biases == ["model.layers.1.mlp.gate.e_score_correction_bias"]  # layer 0 is dense
    bias = ta[biases[0]]
    assert bias.shape == (4,) and bool((bias != 0).all())
    assert not bool((tb[biases[0]] == bias).any())


def test_an_mtp_checkpoint_carries_a_drafting_layer_the_target_skips_and_b_moves_it(tmp_path):
    """MiMo's multi-token-prediction layer sits beside the model in the checkpoint: a decoder
    layer shaped like the model's first, its own norms and input projection; B moves it like
    every tensor, so a drafter left at A is visible in the census."""
    from safetensors.torch import load_file

    from harness.checkpoints.derived import perturbed
    from harness.checkpoints.read import read_headers
    from harness.checkpoints.zoo import MTP_LAYOUTS, tiny_model
    from harness.spec.run import PerturbSpec

    a = tiny_model("mimo", cache=tmp_path)
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"] and config["num_nextn_predict_layers"] == 1
    names = set(read_headers(a))
    mtp = {n.removeprefix("model.mtp_layers.0.") for n in names if n.startswith("model.mtp_layers.")}
    layer = {n.removeprefix("model.layers.0.") for n in names if n.startswith("model.layers.0.")}
    assert mtp == layer | {f"{norm}.weight" for norm in MTP_LAYOUTS["mimo"].norms} | {"input_proj.weight"}
    assert not any(n.startswith("model.mtp_layers.1.") for n in names)
    ta = load_file(a / "model.safetensors")
    tb = load_file(perturbed(a, PerturbSpec(), cache=tmp_path) / "model.safetensors")
    assert all(not ta[n].equal(tb[n]) for n in ta if n.startswith("model.mtp_layers."))
    # A layer drawn afresh, not a copy of the model's own: it drafts tokens of its own.
    assert not ta["model.mtp_layers.0.mlp.up_proj.weight"].equal(ta["model.layers.0.mlp.up_proj.weight"])


def test_a_deepseek_mtp_checkpoint_carries_its_layer_after_the_models_and_b_moves_it(tmp_path):
    """DeepSeek-V3 names its multi-token-prediction layer as the layer after the model's last
    (``model.layers.2`` of a 2-layer model): a dense MLA decoder layer shaped like layer 0, with
    ``enorm``, ``hnorm``, ``eh_proj`` and a ``shared_head.norm`` (vLLM makes the target's
    ``lm_head`` its head); every layer dense, so no expert weights; B moves every MTP tensor."""
    from safetensors.torch import load_file

    from harness.checkpoints.derived import perturbed
    from harness.checkpoints.read import read_headers
    from harness.checkpoints.zoo import MTP_LAYOUTS, tiny_model
    from harness.spec.run import PerturbSpec

    a = tiny_model("deepseek-v3-mtp", cache=tmp_path)
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"] and config["num_nextn_predict_layers"] == 1
    assert config["num_hidden_layers"] == 2 and config["first_k_dense_replace"] == 3
    names = set(read_headers(a))
    assert not any(".experts." in n for n in names)
    mtp = {n.removeprefix("model.layers.2.") for n in names if n.startswith("model.layers.2.")}
    layer = {n.removeprefix("model.layers.0.") for n in names if n.startswith("model.layers.0.")}
    extra = {f"{norm}.weight" for norm in MTP_LAYOUTS["deepseek"].norms} | {"eh_proj.weight"}  # no copy of lm_head
    assert "self_attn.kv_a_proj_with_mqa.weight" in layer and mtp == layer | extra
    assert not any(n.startswith(("model.layers.3.", "model.mtp_layers.")) for n in names)
    ta = load_file(a / "model.safetensors")
    assert not ta["model.layers.2.self_attn.q_proj.weight"].equal(ta["model.layers.0.self_attn.q_proj.weight"])
    tb = load_file(perturbed(a, PerturbSpec(), cache=tmp_path) / "model.safetensors")
    assert all(not ta[n].equal(tb[n]) for n in ta if n.startswith("model.layers.2."))
