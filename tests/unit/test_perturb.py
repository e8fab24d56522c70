"""Perturbations chunk by chunk (harness/perturb.py) and B written tensor by tensor
(write_streamed): every float element moves, in every dtype and across chunk
boundaries; integers stay; the same seed gives the same bytes; the recipe is in the cache
key; and the memory they need is about one tensor, measured as peak RSS."""

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.checkpoints import derived, perturb
from harness.checkpoints.derived import perturbed, with_control
from harness.checkpoints.read import check_target, fingerprint, read_headers
from harness.errors import CheckpointError
from harness.spec.run import ControlSpec, PerturbSpec

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of 1000 elements, so the tensors below span several, the last one partial."""
    monkeypatch.setattr(perturb, "CHUNK_ELEMENTS", 1000)


def hard_values(dtype) -> torch.Tensor:
    """Values a perturbation can fail to move: zeros (scaled, they stay zeros), large values
    (in low precision a small bump rounds away), and ordinary ones; 3 chunks and a bit."""
    g = torch.Generator().manual_seed(0)
    big = 200.0 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else 3.0e4
    x = torch.cat([torch.zeros(1100), torch.full((900,), big), torch.randn(1234, generator=g)])
    return x.reshape(-1, 2).to(dtype)  # 2-D: the chunks cut across rows


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_element_moves_in_every_dtype_across_chunks(small_chunks, dtype):
    a = hard_values(dtype)
    g = torch.Generator().manual_seed(1)
    for name, out in (("gaussian", perturb.gaussian("w", a, g, 1e-6)), ("scale", perturb.scale("w", a, None, 0.0))):
        assert out.dtype == dtype and out.shape == a.shape, name
        changed = out.view(-1) != a.view(-1)  # in the dtype itself: a float32 cast would hide float64 moves
        assert changed.all(), f"{name} left {int((~changed).sum())} of {a.numel()} {dtype} elements unchanged"


def test_in_place_equals_a_new_output_and_the_same_seed_the_same_bytes(small_chunks):
    a = torch.randn(3001, 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    new = perturb.gaussian("w", a, torch.Generator().manual_seed(5), 0.05)
    again = perturb.gaussian("w", a, torch.Generator().manual_seed(5), 0.05)
    in_place = a.clone()
    returned = perturb.gaussian("w", in_place, torch.Generator().manual_seed(5), 0.05, out=in_place)
    assert returned is in_place and torch.equal(new, in_place) and torch.equal(new, again)
    other_seed = perturb.gaussian("w", a, torch.Generator().manual_seed(6), 0.05)
    assert not torch.equal(new, other_seed)
    moved = (new.float() - a.float()).std() / a.float().std()
    assert 0.01 < moved < 0.2  # noise of about strength x spread: a perturbation, not a new tensor


def test_spread_is_the_whole_tensors_over_chunks(small_chunks):
    x = torch.randn(5555, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 10
    assert perturb.spread(x) == pytest.approx(float(x.abs().mean()), rel=1e-12)  # mean |x| wins at mean 10
    y = x - 10
    assert perturb.spread(y) == pytest.approx(float(y.std()), rel=1e-9)
    assert perturb.spread(y.to(torch.bfloat16)) == pytest.approx(float(y.std()), rel=1e-2)
    assert perturb.spread(torch.ones(3000)) == 1.0 and perturb.spread(torch.zeros(0)) == 0.0


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.uint8, torch.bool), ids=str)
def test_integer_and_bool_tensors_are_untouched(dtype):
    a = torch.arange(10).to(dtype)
    for out in (perturb.gaussian("ids", a, torch.Generator().manual_seed(0), 0.5), perturb.scale("ids", a, None, 1.0)):
        assert out.dtype == dtype and torch.equal(out, a)


def write_checkpoint(d, tensors, config=None):
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config or {"vocab_size": 10}))
    return d


def mixed_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "emb.weight": torch.randn(700, 8, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(8),
        "bias": torch.zeros(8, dtype=torch.float16),
        "ids": torch.arange(5, dtype=torch.int32),
        "mask": torch.tensor([True, False]),
        "x.weight": torch.randn(40, 3, generator=g, dtype=torch.float64),
    }


def digest(d):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.glob("*.safetensors"))}


def test_b_is_seeded_byte_for_byte_moves_every_float_and_keeps_integers(small_chunks, tmp_path):
    a = write_checkpoint(tmp_path / "A", mixed_tensors())
    b1 = perturbed(a, PerturbSpec(seed=3), cache=tmp_path / "c1")
    b2 = perturbed(a, PerturbSpec(seed=3), cache=tmp_path / "c2")
    b3 = perturbed(a, PerturbSpec(seed=4), cache=tmp_path / "c3")
    assert digest(b1) == digest(b2) != digest(b3)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b1 / "model.safetensors"))
    for name, t in wa.items():
        assert wb[name].dtype == t.dtype and wb[name].shape == t.shape, name
        if t.is_floating_point():
            assert (wb[name].float() != t.float()).all(), f"every element of {name} must change"
        else:
            assert torch.equal(wb[name], t), f"{name} is not a weight and must stay"
    control = with_control(b1, ControlSpec(tensor="norm.weight", scale=1.01), cache=tmp_path / "c1")
    wc = load_file(str(control / "model.safetensors"))
    assert torch.equal(wc["norm.weight"], (wb["norm.weight"] * 1.01))
    assert all(torch.equal(wc[n], wb[n]) for n in wb if n != "norm.weight")


def test_the_recipe_is_in_every_derived_checkpoints_cache_key(tmp_path, monkeypatch):
    """A B made before chunking (whole-tensor noise) has other bytes for the same seed: its
    cache entry, keyed without the recipe, must not be found, nor one of another recipe."""
    a = write_checkpoint(tmp_path / "A", mixed_tensors())
    spec = PerturbSpec(seed=3)
    b = perturbed(a, spec, cache=tmp_path)
    old_key = hashlib.sha256(f"{fingerprint(a)}|{spec}".encode()).hexdigest()[:16]
    assert b.name != f"A-B-{old_key}"
    assert derived.PERTURB_RECIPE == perturb.RECIPE and str(perturb.CHUNK_ELEMENTS) in perturb.RECIPE
    control, damage = ControlSpec(tensor="norm.weight"), 0.5
    made = (b, with_control(a, control, cache=tmp_path), derived.damaged(a, damage, cache=tmp_path))
    monkeypatch.setattr(derived, "PERTURB_RECIPE", "another-recipe")
    remade = (
        perturbed(a, spec, cache=tmp_path),
        with_control(a, control, cache=tmp_path),
        derived.damaged(a, damage, cache=tmp_path),
    )
    assert all(x != y for x, y in zip(made, remade)), (made, remade)


def test_target_check_reads_headers_only(tmp_path):
    """check_target and read_headers never read tensor data: they pass on files cut right
    after their header."""
    a = write_checkpoint(tmp_path / "A", mixed_tensors())
    cut = write_checkpoint(tmp_path / "cut", mixed_tensors())
    f = cut / "model.safetensors"
    (n,) = struct.unpack("<Q", f.read_bytes()[:8])
    f.write_bytes(f.read_bytes()[: 8 + n])
    check_target(a, cut)
    assert read_headers(cut) == read_headers(a)
    with pytest.raises(CheckpointError, match="ends inside a tensor"):
        perturbed(cut, PerturbSpec(), cache=tmp_path / "c")  # writing B does read them


PEAK = textwrap.dedent("""
    import json, sys, torch
    from pathlib import Path
    from harness.checkpoints.derived import damaged, perturbed, with_control, write_streamed
    from harness.checkpoints.read import check_target, fingerprint, read_headers
    from harness.errors import CheckpointError
    from harness.checkpoints import perturb
    from harness.spec.run import ControlSpec, PerturbSpec

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    def peak_above_start(work):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = status("VmRSS")
        work()
        return status("VmHWM") - before

    source, cache = sys.argv[1], Path(sys.argv[2])
    write_streamed(source, cache / "warm-up", lambda name, t: t)
    perturb.scale("warm-up", torch.ones(1 << 20), None, 0.1)
    extra = {}
    for dtype in ("float32", "bfloat16"):
        t = torch.randn(32 << 20, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
        for mode in ("in_place", "new_output"):
            extra[f"{dtype} {mode}"] = peak_above_start(lambda: perturb.gaussian(
                "w", t, torch.Generator().manual_seed(0), 0.05, out=t if mode == "in_place" else None))
        del t
    extra["checkpoint"] = peak_above_start(lambda: (
        perturbed(source, PerturbSpec(), cache=cache),
        with_control(source, ControlSpec(tensor="t0"), cache=cache)))
    print(json.dumps(extra))
""")


@pytest.fixture(scope="module")
def peak_extra(tmp_path_factory) -> dict[str, int]:
    """Peak RSS above the RSS just before each piece of work, all measured in one process of
    their own (one torch import): perturbing a 32 Mi-element tensor in float32 and bf16, in
    place and into a new output; and writing B and B' of a checkpoint of four 64 MiB tensors."""
    tmp = tmp_path_factory.mktemp("peak")
    g = torch.Generator().manual_seed(0)
    a = write_checkpoint(tmp / "A", {f"t{i}": torch.randn(16 << 20, generator=g) for i in range(4)})
    root = str(Path(__file__).resolve().parents[2])  # this checkout's harness, not the venv's editable install
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        # A fixed mmap threshold turns off glibc's adaptive one: every large block is mapped
        # when allocated and unmapped when freed, so RSS follows the live tensors instead of
        # what the allocator kept from earlier work (a CI run measured 140 MiB for ~110 live).
        "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, str(a), str(tmp / "cache")], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_perturbing_a_large_tensor_needs_about_one_chunk_in_place_and_one_tensor_otherwise(peak_extra, dtype):
    """32 Mi elements (128 MiB in float32, 64 MiB in bf16): perturbed in place, the peak above
    the tensor is a few chunks; into a new output, that output and a few chunks. Whole-tensor
    arithmetic (a float32 copy, the noise, the sum, a mask) needs several tensors more."""
    size = (32 << 20) * torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    chunk = perturb.CHUNK_ELEMENTS * 4  # one float32 chunk
    in_place, new_output = peak_extra[f"{dtype} in_place"], peak_extra[f"{dtype} new_output"]
    assert in_place < 4 * chunk, f"in place: {in_place / 2**20:.0f} MiB above a {size / 2**20:.0f} MiB tensor"
    assert new_output < size + 4 * chunk, (
        f"new output: {new_output / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB tensor"
    )


def test_writing_b_and_b_control_holds_one_tensor_at_a_time(peak_extra):
    """Four 64 MiB tensors in one file: writing B and B' holds one of them and a few chunks,
    never two (tensors read through ``safe_open`` stay mapped until the file is closed)."""
    tensor, chunk = (16 << 20) * 4, perturb.CHUNK_ELEMENTS * 4
    extra = peak_extra["checkpoint"]
    assert extra < tensor + 3 * chunk < 2 * tensor, f"{extra / 2**20:.0f} MiB above the start, for 64 MiB tensors"
