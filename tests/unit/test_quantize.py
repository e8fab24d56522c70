"""Quantized checkpoints the harness writes (harness/checkpoints/quantize.py) and B made from
them (the quantization-aware perturbation): the tensor names, dtypes and shapes vLLM's loaders
read; the int4 packing orders; codes that dequantize back to the float weights; and a B that
differs from A in every quantized weight, scale and zero point while staying a valid checkpoint
of its format. No engine: vLLM's own unpacking code is imported (CPU only) where it checks a
layout."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.checkpoints import perturb
from harness.checkpoints.control import choose_control_tensor
from harness.checkpoints.derived import perturbed, with_control
from harness.checkpoints.quantize import (
    AWQ_ORDER,
    QUANT_FORMATS,
    TensorRole,
    pack_int4,
    quantization_config,
    quantized,
    role_of,
    unpack_int4,
)
from harness.checkpoints.read import read_headers
from harness.errors import CheckpointError, UnknownName
from harness.spec.known_issues import Subject
from harness.spec.run import ControlSpec, PerturbSpec
from tests.helpers import FUSED_EXPERTS

PROJ = {
    "q_proj": (128, 128),
    "k_proj": (64, 128),
    "v_proj": (64, 128),
    "o_proj": (128, 128),
    "gate_proj": (256, 128),
    "up_proj": (256, 128),
    "down_proj": (128, 256),
}
REAL_FORMATS = (
    "ct-w8a8-int8",
    "ct-w8a8-int8-asym",
    "gptq-int4",
    "awq-int4",
    "ct-fp8-w8a8",
    "ct-fp8-static",
    "fp8-block",
    "fixture-boot-max-scale",
    "fixture-fresh-max-scale",
)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    """A float checkpoint with Qwen3's tensor names (2 layers), no engine needed."""
    d = tmp_path_factory.mktemp("float")
    g = torch.Generator().manual_seed(0)
    t = {
        "model.embed_tokens.weight": torch.randn(512, 128, generator=g),
        "lm_head.weight": torch.randn(512, 128, generator=g),
        "model.norm.weight": 1 + 0.2 * torch.randn(128, generator=g),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        for name, shape in PROJ.items():
            mod = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            t[f"{p}{mod}.{name}.weight"] = 0.05 * torch.randn(*shape, generator=g)
        for b in ("q_proj", "k_proj", "v_proj"):
            t[f"{p}self_attn.{b}.bias"] = 0.05 * torch.randn(PROJ[b][0], generator=g)
        t[f"{p}input_layernorm.weight"] = 1 + 0.2 * torch.randn(128, generator=g)
        t[f"{p}post_attention_layernorm.weight"] = 1 + 0.2 * torch.randn(128, generator=g)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "torch_dtype": "float32"}))
    return d


@pytest.fixture(scope="module")
def written(float_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    return {fmt: quantized(float_model, fmt, root / fmt) for fmt in REAL_FORMATS}


def test_int4_packing_orders_and_round_trip():
    values = torch.arange(8, dtype=torch.int32).reshape(1, 8)
    assert int(pack_int4(values, 1)[0, 0]) == 0x76543210  # GPTQ: value j in slot j
    assert int(pack_int4(values, 1, AWQ_ORDER)[0, 0]) == 0x75316420  # AWQ: slots hold 0 2 4 6 1 3 5 7
    g = torch.Generator().manual_seed(0)
    v = torch.randint(0, 16, (64, 48), generator=g, dtype=torch.int32)
    for dim, order in ((0, None), (1, None), (1, AWQ_ORDER)):
        assert torch.equal(unpack_int4(pack_int4(v, dim, order), dim, order), v)


def test_packing_matches_vllms_unpacking():
    """vLLM's CPUWNA16 kernel unpacks GPTQ qweight along dim 0 with its own helper, and its AWQ
    converter reorders with _REVERSE_AWQ_PACK_ORDER: both must read back what was packed."""
    from vllm.model_executor.layers.quantization.auto_awq import _REVERSE_AWQ_PACK_ORDER
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    v = torch.randint(0, 16, (64, 48), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    assert torch.equal(unpack_quantized_values_into_int32(pack_int4(v, 0), scalar_types.uint4b8, 0), v)
    awq = pack_int4(v, 1, AWQ_ORDER)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    slots = (awq.unsqueeze(-1) >> shifts) & 0xF
    assert torch.equal(slots[:, :, list(_REVERSE_AWQ_PACK_ORDER)].reshape(64, 48), v)


def test_formats_write_the_tensors_vllms_loaders_read(written):
    h = {fmt: read_headers(d) for fmt, d in written.items()}
    q = "model.layers.0.self_attn.q_proj."
    down = "model.layers.1.mlp.down_proj."
    for fmt in ("ct-w8a8-int8", "ct-w8a8-int8-asym"):
        assert (h[fmt][q + "weight"].dtype, h[fmt][q + "weight"].shape) == ("I8", (128, 128))
        assert h[fmt][down + "weight_scale"].shape == (128, 1)
    g = h["gptq-int4"]
    assert (g[down + "qweight"].dtype, g[down + "qweight"].shape) == ("I32", (256 // 8, 128))  # [K/8, N]
    assert (g[down + "scales"].dtype, g[down + "scales"].shape) == ("F16", (256 // 32, 128))
    assert g[down + "qzeros"].shape == (256 // 32, 128 // 8) and g[down + "g_idx"].shape == (256,)
    a = h["awq-int4"]
    assert a[down + "qweight"].shape == (256, 128 // 8) and a[down + "qzeros"].shape == (256 // 32, 128 // 8)
    f = h["ct-fp8-w8a8"]
    assert (f[q + "weight"].dtype, f[q + "weight_scale"].shape) == ("F8_E4M3", (128, 1))
    assert h["ct-fp8-static"][q + "input_scale"].shape == (1,) and h["ct-fp8-static"][q + "weight_scale"].shape == (1,)
    assert h["fp8-block"][down + "weight_scale"].shape == (2, 2)  # [N/64, K/128]
    for fmt, hs in h.items():  # norms, embeddings, lm_head and biases stay float, as they were
        assert hs["lm_head.weight"].dtype == "F32" and hs["model.layers.0.input_layernorm.weight"].dtype == "F32", fmt
        assert hs["model.layers.0.self_attn.q_proj.bias"].dtype == "F32", fmt
    assert quantization_config(written["gptq-int4"])["quant_method"] == "gptq"
    ct = quantization_config(written["ct-w8a8-int8-asym"])
    assert ct["config_groups"]["group_0"]["input_activations"]["symmetric"] is False


def test_codes_dequantize_to_the_float_weights(float_model, written):
    w = load_file(str(float_model / "model.safetensors"))["model.layers.1.mlp.down_proj.weight"]  # [N, K]
    p = "model.layers.1.mlp.down_proj."
    ct = load_file(str(written["ct-w8a8-int8"] / "model.safetensors"))
    step = ct[p + "weight_scale"]
    assert ((ct[p + "weight"].float() * step - w).abs() <= step / 2 + 1e-7).all()
    g = load_file(str(written["gptq-int4"] / "model.safetensors"))
    codes = unpack_int4(g[p + "qweight"], 0).float() - 8  # uint4b8: stored + 8, [K, N]
    s = g[p + "scales"].float().repeat_interleave(32, dim=0)
    assert ((codes * s - w.t()).abs() <= s / 2 + 1e-3).all()
    a = load_file(str(written["awq-int4"] / "model.safetensors"))
    codes = unpack_int4(a[p + "qweight"], 1, AWQ_ORDER).float()
    zeros = unpack_int4(a[p + "qzeros"], 1, AWQ_ORDER).float().repeat_interleave(32, dim=0)
    s = a[p + "scales"].float().repeat_interleave(32, dim=0)
    assert ((codes - zeros) * s - w.t()).abs().max() <= float(s.max())  # zero point rounding: at most a step
    f = load_file(str(written["ct-fp8-w8a8"] / "model.safetensors"))
    deq = f[p + "weight"].float() * f[p + "weight_scale"]
    assert torch.allclose(deq, w, rtol=0.07, atol=1e-4) and not torch.isnan(deq).any()


def test_writing_is_deterministic(float_model, written, tmp_path):
    again = quantized(float_model, "gptq-int4", tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (written["gptq-int4"] / "model.safetensors").read_bytes()
    with pytest.raises(UnknownName, match="Available"):
        quantized(float_model, "nf4", tmp_path / "nf4")


def test_a_checkpoint_without_projections_cannot_be_quantized(tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(8, 32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no decoder-layer linear projection"):
        quantized(tmp_path, "ct-w8a8-int8", tmp_path / "out")


def test_roles_name_every_quantized_tensor_of_every_format(written):
    expected = {
        "weight": {"I8": "int-codes", "F8_E4M3": "fp8-codes"},
        "weight_scale": "scale",
        "scales": "scale",
        "input_scale": "scale",
        "qweight": "int4-packed",
        "g_idx": "layout",
    }
    for fmt, d in written.items():
        qc = quantization_config(d)
        for name, h in read_headers(d).items():
            role = role_of(qc, name, h.dtype)
            leaf = name.rsplit(".", 1)[-1]
            if h.dtype in ("F32", "F16", "BF16") and leaf not in ("weight_scale", "scales", "input_scale"):
                assert role is None, (fmt, name)  # ordinary float tensors: the gaussian perturbation
                continue
            want = expected.get(leaf)
            want = want.get(h.dtype) if isinstance(want, dict) else want
            if leaf == "qzeros":
                want = "layout" if fmt == "gptq-int4" else "int4-zero-points"  # GPTQ sym: the format's constant
            assert role is not None and role.role == want, (fmt, name, role)
    assert role_of({"quant_method": "compressed-tensors"}, "x.weight_zero_point", "I8") == TensorRole("int-zero-point")


@pytest.mark.parametrize("fmt", REAL_FORMATS)
def test_b_moves_every_code_scale_and_zero_point_and_stays_valid(written, fmt, tmp_path, monkeypatch):
    monkeypatch.setattr(perturb, "CHUNK_ELEMENTS", 1000)  # the moves cross chunk boundaries
    a_dir = written[fmt]
    b_dir = perturbed(a_dir, PerturbSpec(), cache=tmp_path)
    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    qc = quantization_config(a_dir)
    assert a.keys() == b.keys()
    for name in a:
        role = role_of(qc, name, read_headers(a_dir)[name].dtype)
        x, y = a[name], b[name]
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        if role is not None and role.role == "layout":
            assert torch.equal(x, y), name  # what the format fixes stays
            continue
        xs, ys = x.reshape(-1).view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x.reshape(-1), None
        ys = y.reshape(-1).view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y.reshape(-1)
        if role is not None and role.role == "int4-packed":
            moved = (unpack_int4(x, 0) - unpack_int4(y, 0)).abs()
            assert (moved == 1).all(), name  # every 4-bit code one step
        else:
            assert (xs != ys).all(), f"{name}: {int((xs == ys).sum())} elements unchanged"
        if role is not None and role.role == "scale":
            assert (y > 0).all() and ((y / x - 1).abs() < 0.2).all(), name
        if role is not None and role.role in ("int-codes", "fp8-codes"):
            step = (x.float() - y.float()).abs() if x.dtype == torch.int8 else None
            assert step is None or (step == 1).all(), name
            assert not torch.isnan(y.float()).any(), name


def test_the_quantized_b_is_cached_under_its_own_recipe(written, tmp_path):
    d = written["ct-w8a8-int8"]
    first = perturbed(d, PerturbSpec(), cache=tmp_path)
    assert perturbed(d, PerturbSpec(), cache=tmp_path) == first
    assert perturbed(d, PerturbSpec(seed=2), cache=tmp_path) != first


def test_the_control_of_a_quantized_checkpoint_is_a_scale_its_kernel_reads(written, float_model, tmp_path):
    for fmt, leaf in (
        ("ct-w8a8-int8", "weight_scale"),
        ("gptq-int4", "scales"),
        ("awq-int4", "scales"),
        ("ct-fp8-w8a8", "weight_scale"),
        ("fp8-block", "weight_scale"),
    ):
        name, why = choose_control_tensor(read_headers(written[fmt]), quantized=True)
        assert name == f"model.layers.0.mlp.down_proj.{leaf}", (fmt, name)  # never q/k: QK-norm undoes them
        assert why.startswith("automatic: a quantized checkpoint")
    name, why = choose_control_tensor(read_headers(float_model), online_quantization="fp8_per_channel")
    assert name == "model.layers.0.mlp.down_proj.weight" and "online" in why
    assert choose_control_tensor(read_headers(float_model))[0] == "model.layers.0.post_attention_layernorm.weight"
    b = perturbed(written["gptq-int4"], PerturbSpec(), cache=tmp_path)
    control = "model.layers.0.mlp.down_proj.scales"
    bc = with_control(b, ControlSpec(tensor=control), cache=tmp_path)
    x, y = load_file(str(b / "model.safetensors")), load_file(str(bc / "model.safetensors"))
    assert torch.allclose(y[control].float(), x[control].float() * 1.01, rtol=2e-3)
    assert all(torch.equal(x[k], y[k]) for k in x if k != control)
    code = "model.layers.0.mlp.down_proj.qweight"  # a code tensor as the control moves one step, not "scaled"
    bq = with_control(b, ControlSpec(tensor=code), cache=tmp_path)
    moved = unpack_int4(load_file(str(bq / "model.safetensors"))[code], 0) - unpack_int4(x[code], 0)
    assert (moved.abs() == 1).all()


def test_a_checkpoints_quantization_is_described_for_known_issues(written):
    from harness.checkpoints.quantize import describe_quantization
    from harness.checkpoints.variants import KV_FP8_CONFIG

    names = {fmt: describe_quantization(quantization_config(d)) for fmt, d in written.items()}
    assert names["fp8-block"] == "compressed-tensors/float/block"
    assert names["ct-w8a8-int8"] == "compressed-tensors/int/channel"
    assert names["gptq-int4"] == "gptq/int/group" and names["awq-int4"] == "awq/int/group"
    assert describe_quantization(None) is None and describe_quantization(
        {"quant_method": "fp8", "weight_block_size": [128, 128]}
    ) == ("fp8/float/block")
    # Float weights with only the KV cache's scales: their own scope, not "?/?".
    assert describe_quantization(KV_FP8_CONFIG) == "compressed-tensors/kv-cache"


def test_every_format_is_registered():
    assert set(REAL_FORMATS) <= set(QUANT_FORMATS.names())


def test_a_cpu_op_stub_and_a_missing_kernel_are_vllm_refusals():
    """The CPU build declares ``static_scaled_fp8_quant`` with no arguments and no kernel, so a
    static fp8 engine raises at load: that is vLLM declining to run here (SKIPPED with its words),
    not a harness ERROR. The same words raised outside vLLM stay an error."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    from harness.arm.process import refused_by_vllm

    if not current_platform.is_cpu():
        pytest.skip("the stub is the CPU build's")
    with pytest.raises(RuntimeError, match=r"expected at most 0 argument") as stub:
        ops.scaled_fp8_quant(torch.ones(4, 32, dtype=torch.bfloat16), torch.ones(1))
    assert refused_by_vllm(stub.value)
    assert not refused_by_vllm(RuntimeError(str(stub.value)))  # no vLLM frame raised it
    assert not refused_by_vllm(ValueError("Failed to find a kernel that can implement the ScaledMM linear layer"))


def test_what_the_avx2_kernel_library_lacks_is_a_vllm_refusal(monkeypatch):
    """Without AVX-512, vLLM 0.32 loads ``_C_AVX2``, which has no ``cpu_gemm_wna16`` (a GPTQ or AWQ
    engine raises AttributeError at its first forward), and refuses an fp8 KV cache: both are vLLM
    declining to run here. The same words raised outside vLLM, or another AttributeError, stay
    errors."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends import cpu_attn

    from harness.arm.process import refused_by_vllm

    if not current_platform.is_cpu():
        pytest.skip("the CPU extensions are the CPU build's")
    with pytest.raises(AttributeError, match=r"'_C' object has no attribute") as missing:
        ops.awq_dequantize(torch.ones(2), torch.ones(2), torch.ones(2), 0, 0, 0)  # in no CPU extension
    assert refused_by_vllm(missing.value)
    assert not refused_by_vllm(AttributeError(str(missing.value)))  # no vLLM frame raised it
    assert not refused_by_vllm(AttributeError("'NoneType' object has no attribute 'weight'"))
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with pytest.raises(NotImplementedError, match="requires x86 with AVX-512") as fp8_kv:
        cpu_attn._get_attn_isa(torch.bfloat16, 16, 64, "fp8")
    assert refused_by_vllm(fp8_kv.value)
    assert not refused_by_vllm(NotImplementedError(str(fp8_kv.value)))


def test_a_kernel_that_takes_none_of_the_models_dtype_is_a_vllm_refusal():
    """vLLM 0.32 picks its AMX MLA backend for a float32 MLA model too, and the backend's weight
    packing refuses float32 at start-up (measured: the zoo's DeepSeek-V3 on an AMX Xeon). Raised
    where vLLM raises it, that is vLLM declining; the same words raised elsewhere are not."""
    import vllm.v1.attention.backends.mla.amx_mla as amx_mla

    from harness.arm.process import refused_by_vllm

    words = "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or int4)."
    with pytest.raises(RuntimeError) as raised:
        exec(compile(f"raise RuntimeError({words!r})", amx_mla.__file__, "exec"), {})
    assert refused_by_vllm(raised.value)
    assert not refused_by_vllm(RuntimeError(words))  # no vLLM frame raised it
    assert not refused_by_vllm(RuntimeError("expected weight and input to have the same dtype"))


def test_a_known_issue_scoped_to_a_kernel_path_applies_only_where_that_path_ran():
    from harness.paths import PATHS
    from harness.spec.known_issues import KNOWN_ISSUES, quantization_of

    issue = next(k for k in KNOWN_ISSUES if "CPUInt8ScaledMMLinearKernel:_apply_weights_onednn" in k.kernels)
    w4a8 = next(k for k in KNOWN_ISSUES if "CPUWNA16LinearKernel:w4a8" in k.kernels)
    ran = ("AutoAWQMarlinLinearMethod/CPUWNA16LinearKernel:w4a8",)
    assert w4a8.applies("reload_weights", Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=ran))
    assert not w4a8.applies("reload_weights", Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=ran[:0]))
    assert not w4a8.applies(
        "reload_weights", Subject("cpu", "0.32.0", "LlamaForCausalLM", "bfloat16", kernels=ran)
    )  # no bias
    fp8_block = "compressed-tensors/float/block"
    block = next(k for k in KNOWN_ISSUES if fp8_block in k.quantization)
    assert block.applies(
        "http_reload", Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16", quantization=fp8_block)
    )
    assert not block.applies(
        "http_reload", Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16")
    )  # float checkpoint
    assert not block.applies(
        "http_reload", Subject("cpu", "0.32.0", "LlamaForCausalLM", "bfloat16", quantization=fp8_block)
    )
    # The fused-MoE expert corruption is the unquantized kernel's: an online-int8 MoE expects nothing.
    moe = next(
        k for k in KNOWN_ISSUES if k.tensor_pattern == r"\.experts\." and "Qwen3MoeForCausalLM" in k.architectures
    )
    assert moe.applies(
        "reload_weights", Subject("cpu", "0.32.0", "Qwen3MoeForCausalLM", "bfloat16", kernels=FUSED_EXPERTS)
    )
    assert not moe.applies("reload_weights", Subject("cpu", "0.32.0", "Qwen3MoeForCausalLM", "bfloat16"))  # none ran
    online = quantization_of(None, {"quantization": "int8_per_channel_weight_only"})
    assert online == "online/int8_per_channel_weight_only" and quantization_of(fp8_block, {}) == fp8_block
    assert not moe.applies(
        "reload_weights",
        Subject("cpu", "0.32.0", "Qwen3MoeForCausalLM", "bfloat16", kernels=FUSED_EXPERTS, quantization=online),
    )
    onednn = ("CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_onednn",)
    amx = ("CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_sgl",)
    assert issue.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=onednn)
    )
    assert not issue.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=amx)
    )
    assert not issue.applies("reload_weights", Subject("cpu (x86_64)", "0.32.0", "Qwen3ForCausalLM", "bfloat16"))
    path = PATHS.get("reload_weights")
    assert issue in path.known_issues_for(
        Subject("cpu (x86_64)", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=onednn)
    )
    assert issue not in path.known_issues_for(
        Subject("cpu (x86_64)", "0.32.0", "Qwen3ForCausalLM", "bfloat16", kernels=amx)
    )


def test_the_census_names_the_quantized_kernels_a_model_runs():
    """``quant_kernels`` reads the method (or compressed-tensors scheme) of every quantized
    linear layer and its kernel's chosen path; unquantized layers are not listed."""
    from types import SimpleNamespace

    from torch import nn

    from harness.worker.census import quant_kernels

    class CPUInt8ScaledMMLinearKernel:
        def __init__(self, chosen):
            self.linear_method = chosen

    def _apply_weights_onednn():
        pass

    class CompressedTensorsW8A8Int8:
        def __init__(self):
            self.kernel = CPUInt8ScaledMMLinearKernel(_apply_weights_onednn)

    class UnquantizedLinearMethod:
        pass

    def linear(method, scheme=None):
        m = nn.Module()
        m.input_size_per_partition, m.quant_method = 128, method
        if scheme is not None:
            m.scheme = scheme
        return m

    model = nn.Sequential(
        linear(SimpleNamespace(), CompressedTensorsW8A8Int8()),
        linear(UnquantizedLinearMethod()),
        linear(type("AutoGPTQLinearMethod", (), {"kernel": type("CPUWNA16LinearKernel", (), {})()})()),
    )
    model[2].use_w4a8 = True  # CPUWNA16 records its per-layer path on the layer
    assert quant_kernels(model) == (
        "AutoGPTQLinearMethod/CPUWNA16LinearKernel:w4a8",
        "CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_onednn",
    )


def test_the_tied_head_issue_is_not_expected_of_an_untied_model_of_the_same_class():
    """The tied-lm_head issue (harness/spec/known_issues.py) is scoped on the checkpoint's
    ``tie_word_embeddings``: every untied bf16 Qwen3 cell (the quantized families among them)
    would otherwise be expected to fail, and its PASS reported as XPASS."""
    from harness.paths import PATHS

    path = PATHS.get("reload_weights")

    def expected(arch: str, tied: bool, flags: tuple[str, ...] = ("avx2", "avx512_f")) -> bool:
        issues = path.known_issues_for(
            Subject("cpu", "0.32.0", arch, "bfloat16", cpu_flags=flags, tied_embeddings=tied)
        )
        return any("tied lm_head" in k.title for k in issues)

    assert expected("Qwen3ForCausalLM", True) and not expected("Qwen3ForCausalLM", False)
    # Any architecture's tied head (measured on five), where the head has a GEMM copy: oneDNN's
    # (AVX-512) or SGL's (AMX); an AVX2 CPU's bf16 head reads the shared parameter itself.
    assert expected("LlamaForCausalLM", True) and expected("Gemma3ForCausalLM", True, ("amx_tile",))
    assert not expected("LlamaForCausalLM", True, ("avx2",))


def test_the_tied_head_issue_covers_every_in_place_path_it_was_measured_on_and_no_other():
    """Measured with every tied zoo family on the AVX512-BF16 EPYC: the head's kernel copy stays
    at A after every in-place refit; the kernel-format reload is the packed-GEMM issue's cell, and
    a restart from saved state (sharded_state) reloads nothing in place."""
    from harness.paths import PATHS

    def titles(path: str) -> list[str]:
        issues = PATHS.get(path).known_issues_for(
            Subject("cpu", "0.32.0", "LlamaForCausalLM", "bfloat16", cpu_flags=("avx512_f",), tied_embeddings=True)
        )
        return [k.title for k in issues]

    for path in ("reload_weights_iterator", "trainer_steps_gloo", "http_weight_transfer", "dummy_start", "compiled"):
        assert any("tied lm_head" in t for t in titles(path)), path
    # float32: oneDNN builds the head's handle on every x86 CPU (measured in every tied family).
    fp32 = PATHS.get("http_reload").known_issues_for(
        Subject("cpu", "0.32.0", "Qwen2ForCausalLM", "float32", cpu_flags=("avx2",), tied_embeddings=True)
    )
    assert any("tied lm_head" in k.title for k in fp32)
    assert not any("tied lm_head" in t for t in titles("reload_kernel_format"))
    assert not any("tied lm_head" in t for t in titles("sharded_state"))
    assert any("packed bf16 GEMM" in t for t in titles("reload_kernel_format"))


def test_the_bf16_sharded_state_gap_is_expected_on_avx512_only_and_by_its_error():
    """In bf16 the oneDNN handles exist only where oneDNN takes bf16 GEMMs (AVX-512): there the
    saved state lacks the linear weights; on AVX2 the bf16 round trip passes (measured)."""
    from harness.paths import PATHS

    path = PATHS.get("sharded_state")

    def gap(flags: tuple[str, ...], dtype: str = "bfloat16") -> list:
        return [
            k
            for k in path.known_issues_for(Subject("cpu", "0.32.0", "LlamaForCausalLM", dtype, cpu_flags=flags))
            if k.error_contains == "Missing keys"
        ]

    assert len(gap(("avx2", "avx512_f"))) == 1 and gap(("avx2",)) == []
    assert len(gap(("avx2",), "float32")) == 1  # float32's oneDNN handles exist on every CPU


def test_prepare_records_what_known_issues_are_scoped_on(written, tmp_path):
    from harness.checkpoints.prepare import prepare

    config = json.loads((written["fp8-block"] / "config.json").read_text())
    assert "tie_word_embeddings" not in config  # the fake float model's config does not say
    cs = prepare(str(written["fp8-block"]), None, PerturbSpec(), ControlSpec(), cache=tmp_path)
    assert (cs.architecture, cs.quantization, cs.tied_embeddings) == (
        "Qwen3ForCausalLM",
        "compressed-tensors/float/block",
        None,
    )


def test_the_quantized_scenario_runs_every_format_and_the_online_quantizations():
    from harness.checkpoints.zoo import ONLINE_QUANT_FAMILIES, QUANTIZED_FAMILIES, family
    from harness.spec.engine_config import decode
    from harness.spec.scenario import expand
    from scenarios import SCENARIOS

    spec = SCENARIOS.get("quantized")()
    labels = [m.label for m in spec.models]
    assert labels == [f.label for f in QUANTIZED_FAMILIES + ONLINE_QUANT_FAMILIES]
    assert spec.dtypes == ("bfloat16",) and spec.sabotage
    online = {m.label: decode(m.engine_args) for m in spec.models if m.engine_args}
    assert online == {
        "qwen3-online-fp8": {"quantization": "fp8_per_channel"},
        "qwen3-moe-online-int8": {"quantization": "int8_per_channel_weight_only"},
    }
    assert family("qwen3-moe-online-int8").architecture == "Qwen3MoeForCausalLM"
    groups = expand(spec, only=("reload_weights[*",))
    assert len(groups) == len(labels) and all(g.spec.engine.dtype == "bfloat16" for g in groups)
    fp8 = next(g for g in groups if g.model.label == "qwen3-online-fp8")
    assert decode(fp8.spec.engine.engine_args) == {"quantization": "fp8_per_channel"}


def test_the_quantized_grids_findings_are_scoped_to_what_measured_them():
    """-s quantized on every CPU path (AVX512-BF16 EPYC): each finding it declared is expected
    where it was measured and nowhere else, so a fixed vLLM shows as XPASS and an unaffected
    engine stays judged."""
    import re

    from harness.paths import PATHS

    def titles(path: str, **scope) -> list[str]:
        return [
            k.title
            for k in PATHS.get(path).known_issues_for(Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16", **scope))
        ]

    onednn = ("CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_onednn",)
    amx = ("CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_sgl",)
    for path in ("reload_weights_iterator", "transfer_gloo", "trainer_steps", "http_weight_transfer", "dummy_start"):
        assert any("freed weight scale" in t for t in titles(path, kernels=onednn)), path
        assert not any("freed weight scale" in t for t in titles(path, kernels=amx)), path
    assert any("azp_adj" in t for t in titles("sharded_state", kernels=onednn))
    assert not any("azp_adj" in t for t in titles("sharded_state", kernels=amx))
    # The dummy start's random attention scales: compressed-tensors' KV-cache Parameters only.
    for fmt, expected in (
        ("compressed-tensors/int/channel", True),
        ("compressed-tensors/float/channel", True),
        ("gptq/int/group", False),
        (None, False),
    ):
        assert any("dummy start" in t for t in titles("dummy_start", quantization=fmt)) is expected, fmt
    (scales,) = [
        k
        for k in PATHS.get("dummy_start").known_issues_for(
            Subject("cpu", "0.32.0", "Qwen3ForCausalLM", "bfloat16", quantization="compressed-tensors/int/channel")
        )
        if "dummy start" in k.title
    ]
    pattern = re.compile(scales.tensor_pattern)
    assert pattern.search("model.layers.0.self_attn.attn._k_scale_float") and pattern.search(
        "model.layers.1.self_attn.attn._prob_scale"
    )
    assert not pattern.search("model.layers.0.self_attn.qkv_proj.weight_scale")
    # The sharded-state saver and loader: fp8's transposed weight; int4's re-blocked qweight.
    assert any("fp8 (channel)" in t for t in titles("sharded_state", quantization="compressed-tensors/float/channel"))
    assert not any("fp8 (channel)" in t for t in titles("sharded_state", quantization="compressed-tensors/int/channel"))
    assert any("re-blocked" in t for t in titles("sharded_state", quantization="awq/int/group"))
    assert not any("re-blocked" in t for t in titles("sharded_state", quantization=None))
