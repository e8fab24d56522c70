import json

import pytest
import torch
from safetensors.torch import save_file

from harness.checkpoints.derived import perturbed, with_control
from harness.checkpoints.perturb import gaussian
from harness.checkpoints.read import load_weights, weight_files
from harness.checkpoints.tiny import tiny_qwen3
from harness.errors import CheckpointError
from harness.spec.run import ControlSpec, PerturbSpec


@pytest.fixture()
def ckpt(tmp_path):
    d = tmp_path / "A"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "w": torch.randn(8, 4, generator=g),
            "norm.weight": torch.ones(4),
            "bias": torch.zeros(4),
            "ids": torch.arange(3),
        },
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(json.dumps({"vocab_size": 10}))
    (d / "tokenizer.json").write_text("{}")
    return d


def test_perturbation_changes_every_float_tensor_and_is_seeded(ckpt, tmp_path):
    b1 = perturbed(ckpt, PerturbSpec(seed=3), cache=tmp_path / "c1")
    b2 = perturbed(ckpt, PerturbSpec(seed=3), cache=tmp_path / "c2")
    a, w1, w2 = (load_weights(d) for d in (ckpt, b1, b2))
    for name in ("w", "norm.weight", "bias"):  # constant ones and zeros move too
        assert not torch.equal(a[name], w1[name]), name
        assert (a[name] != w1[name]).all(), f"every element of {name} must change"
        assert torch.equal(w1[name], w2[name])
    assert torch.equal(a["ids"], w1["ids"])  # integer tensors are not weights
    assert (b1 / "tokenizer.json").exists() and (b1 / "config.json").exists()


def test_control_scales_exactly_one_tensor(ckpt, tmp_path):
    bc = with_control(ckpt, ControlSpec(tensor="w", scale=1.01), cache=tmp_path)
    a, c = load_weights(ckpt), load_weights(bc)
    assert torch.allclose(c["w"], a["w"] * 1.01)
    assert all(torch.equal(a[n], c[n]) for n in a if n != "w")


def test_bad_checkpoints_are_usage_errors(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        weight_files(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="positive-control tensor 'missing.weight'"):
        with_control(ckpt, ControlSpec(tensor="missing.weight"), cache=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        weight_files(empty)


def test_gaussian_moves_a_zero_tensor():
    out = gaussian("z", torch.zeros(5), torch.Generator().manual_seed(0), 0.05)
    assert (out != 0).all()


def test_tiny_qwen3_is_deterministic_and_norms_are_not_ones(tmp_path):
    d1 = tiny_qwen3(seed=0, cache=tmp_path / "x")
    d2 = tiny_qwen3(seed=0, cache=tmp_path / "y")
    w1, w2 = load_weights(d1), load_weights(d2)
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    norms = [k for k in w1 if k.endswith("norm.weight")]
    assert any("q_norm" in k for k in norms) and any("k_norm" in k for k in norms)
    assert all(not torch.allclose(w1[k], torch.ones_like(w1[k])) for k in norms)
    assert any(k.endswith("q_proj.bias") for k in w1)
    assert json.loads((d1 / "config.json").read_text())["head_dim"] == 32
    fixture = tiny_qwen3(seed=0, architecture="StaleQKNormQwen3ForCausalLM", cache=tmp_path / "x")
    assert json.loads((fixture / "config.json").read_text())["architectures"] == ["StaleQKNormQwen3ForCausalLM"]


def test_b_without_one_tensor_keeps_every_other_tensor_bit_for_bit(tmp_path):
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from harness.checkpoints.derived import without_tensor

    src = tmp_path / "b"
    src.mkdir()
    (src / "config.json").write_text('{"vocab_size": 8}')
    first = {"a.weight": torch.randn(3, 5), "norm.weight": torch.randn(7)}
    second = {"c.bias": torch.arange(4, dtype=torch.int64), "d.weight": torch.randn(2, 2).to(torch.bfloat16)}
    save_file(first, str(src / "model-00001-of-00002.safetensors"))
    save_file(second, str(src / "model-00002-of-00002.safetensors"))
    weight_map = {
        **dict.fromkeys(first, "model-00001-of-00002.safetensors"),
        **dict.fromkeys(second, "model-00002-of-00002.safetensors"),
    }
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    out = without_tensor(src, "norm.weight", cache=tmp_path / "cache")
    kept = {
        **load_file(str(out / "model-00001-of-00002.safetensors")),
        **load_file(str(out / "model-00002-of-00002.safetensors")),
    }
    assert sorted(kept) == ["a.weight", "c.bias", "d.weight"]
    for name, t in {**first, **second}.items():
        if name != "norm.weight":
            assert kept[name].dtype == t.dtype and torch.equal(kept[name], t), name
    assert "norm.weight" not in json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert (out / "config.json").read_text() == '{"vocab_size": 8}'
    assert without_tensor(src, "norm.weight", cache=tmp_path / "cache") == out  # cached


def test_one_safetensors_reader_headers_and_tensors_in_data_order(ckpt, tmp_path):
    """Headers without torch; tensors in the order their bytes lie (``load_file``'s order,
    which is not name order when dtypes differ), the trainer's metadata in that same order."""
    from safetensors.torch import load_file

    from harness import safetensors_files

    f = ckpt / "model.safetensors"
    n, header = safetensors_files.read_header(f)
    entries = safetensors_files.tensor_entries(header)
    assert n > 0 and {name for name, _ in entries} == {"w", "norm.weight", "bias", "ids"}
    names = [name for name, _ in safetensors_files.tensors([f])]
    assert names == list(load_file(str(f))) == [name for name, _ in entries]
    assert names != sorted(names)  # the int64 tensor lies first: data order is not name order
    assert [name for name, _ in safetensors_files.tensors([f], exclude=["w"], only=["w", "bias"])] == ["bias"]
    pytest.importorskip("vllm")
    from harness.machinery.transfer import CheckpointSource
    from harness.worker import vllm_compat

    source = CheckpointSource(ckpt, exclude=("bias",))
    assert [(m.name, m.dtype, tuple(m.shape)) for m in vllm_compat.source_metadata(source)] == [
        (name, t.dtype, tuple(t.shape)) for name, t in source
    ]
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(safetensors_files.UnreadableFile, match="not a readable safetensors file"):
        safetensors_files.read_header(tmp_path / "bad.safetensors")
