"""Checkpoints derived from another: B (perturbed), B' (the positive control), B without the
control tensor (for sabotaged refits) and B damaged (for the accuracy probe).

B and B' are written tensor by tensor into shards laid out exactly like the source's (same
files, same header, same offsets: a perturbation keeps dtype and shape), so the extra memory
is about one tensor, never the whole model. Each is cached by a key over the source files and
the recipe, so repeated runs reuse them; it is written through ``harness.cache.cached_variant``
(a private staging directory, renamed whole), so concurrent runs make it once and a killed
writer leaves nothing that looks complete."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from harness import safetensors_files
from harness.cache import cached_variant
from harness.checkpoints.perturb import QUANT_RECIPE
from harness.checkpoints.perturb import RECIPE as PERTURB_RECIPE  # torch-free: a cached B is found without torch
from harness.checkpoints.quantize import quantization_config, role_of
from harness.checkpoints.read import fingerprint, raw_header, read_headers, weight_files
from harness.errors import CheckpointError
from harness.settings import DEFAULT_CACHE
from harness.spec.run import ControlSpec, PerturbSpec

_INDEX = safetensors_files.INDEX


def write_streamed(source: str | Path, dest: Path, transform: Callable[[str, object], object]) -> Path:
    """Write ``dest`` as ``source`` with every tensor passed through ``transform(name, t)``,
    one tensor at a time, in sorted name order (so a seeded transform is reproducible).

    ``t`` is a fresh tensor read for the transform alone: it may change it in place and
    return it. Each shard keeps the source's file name, header and offsets (``transform``
    must keep dtype and shape), and the index is copied. The tensor is read with plain file
    reads, not ``safe_open``, whose tensors stay mapped until the file is closed: so the
    peak extra memory is one tensor (plus what the transform allocates), never the model.
    """
    return cached_variant(dest, lambda staging: _write_streamed(source, staging, transform), _complete)


def _write_streamed(source: str | Path, tmp: Path, transform: Callable[[str, object], object]) -> None:
    import torch

    files = weight_files(source)
    _copy_non_weights(source, tmp)
    layout = {}  # name -> (source file, output file, data start, header entry)
    with ExitStack() as stack:
        for f in files:
            n, header = raw_header(f)
            src = stack.enter_context(open(f, "rb"))
            out = stack.enter_context(open(tmp / f.name, "wb"))
            src.seek(0)  # the header verbatim: same names, dtypes, shapes, offsets
            out.write(src.read(8 + n))
            for name, h in safetensors_files.tensor_entries(header):
                layout[name] = (src, out, 8 + n, h)
        for name in sorted(layout):
            src, out, data_start, entry = layout[name]
            try:
                before = safetensors_files.read_tensor(src, data_start, entry)
            except safetensors_files.UnreadableFile as exc:
                raise CheckpointError(f"{name}: {exc}") from None
            dtype, shape = before.dtype, before.shape
            after = transform(name, before)
            if after.dtype != dtype or after.shape != shape:
                raise CheckpointError(
                    f"transform changed {name}: {dtype} {list(shape)} -> {after.dtype} {list(after.shape)}"
                )
            raw = after.contiguous().reshape(-1).view(torch.uint8).numpy()  # a view: no copy
            begin, end = entry["data_offsets"]
            assert raw.nbytes == end - begin, (name, raw.nbytes, end - begin)
            out.seek(data_start + begin)
            out.write(raw.data)
            del before, after, raw


def _complete(dest: Path) -> bool:
    return dest.is_dir() and (dest / "config.json").is_file() and any(dest.glob("*.safetensors"))


def _copy_non_weights(source: str | Path, staging: Path) -> None:
    """``source``'s non-weight files (config, tokenizer, index) into the staging directory."""
    for f in Path(source).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, staging / f.name)


def without_tensor(source: str | Path, name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """``source`` with one tensor left out: the checkpoint a refit that skips it would read.
    The other tensors' bytes are copied as they are, in chunks (no torch, no whole tensor)."""
    key = hashlib.sha256(f"{fingerprint(source)}|without|{name}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-without-{key}"
    return cached_variant(dest, lambda staging: _write_without(source, name, staging), _complete)


def _write_without(source: str | Path, name: str, tmp: Path) -> None:
    _copy_non_weights(source, tmp)
    index = tmp / _INDEX
    if index.is_file():
        content = json.loads(index.read_text())
        content.get("weight_map", {}).pop(name, None)
        index.write_text(json.dumps(content, indent=2))
    for f in weight_files(source):
        n, header = raw_header(f)
        kept = [(k, v) for k, v in safetensors_files.tensor_entries(header) if k != name]  # in data order
        metadata = safetensors_files.METADATA
        offset, new_header = 0, ({metadata: header[metadata]} if metadata in header else {})
        for k, v in kept:
            size = v["data_offsets"][1] - v["data_offsets"][0]
            new_header[k] = {**v, "data_offsets": [offset, offset + size]}
            offset += size
        with open(f, "rb") as src, open(tmp / f.name, "wb") as out:
            out.write(safetensors_files.encode_header(new_header))
            for k, v in kept:
                begin, end = v["data_offsets"]
                src.seek(8 + n + begin)
                remaining = end - begin
                while remaining:
                    chunk = src.read(min(_COPY_CHUNK_BYTES, remaining))
                    if not chunk:
                        raise CheckpointError(f"{f} ends inside tensor {k}")
                    out.write(chunk)
                    remaining -= len(chunk)


_COPY_CHUNK_BYTES = 64 << 20


def _recipe(source: str | Path) -> str:
    """The perturbations' version, and the quantization-aware one's for a quantized checkpoint
    (so float checkpoints keep their cached B)."""
    return PERTURB_RECIPE + (f"|{QUANT_RECIPE}" if quantization_config(source) else "")


def perturbed(source: str | Path, spec: PerturbSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B: ``source`` with ``spec`` applied to every tensor; in a quantized checkpoint, every
    code, scale and zero point moved on its own grid instead (``perturb.perturb_role``)."""
    key = hashlib.sha256(f"{fingerprint(source)}|{spec}|{_recipe(source)}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-B-{key}"
    if _complete(dest):
        return dest  # before importing torch: that import is most of a cached prepare (profiled)
    return _write_perturbed(source, dest, spec)


def _write_perturbed(source: str | Path, dest: Path, spec: PerturbSpec) -> Path:
    from harness.checkpoints.perturb import PERTURBATIONS, perturb_role

    fn = PERTURBATIONS.get(spec.name)
    roles = _roles(source)

    @functools.cache
    def generator():  # made by the writer only: a run that waits for another's B never imports torch
        import torch

        return torch.Generator().manual_seed(spec.seed)

    def transform(name: str, t):
        role = roles.get(name)
        if role is not None:
            return perturb_role(role, t, generator(), spec.strength)
        # In place: write_streamed's tensor is ours, so no second copy of the largest tensor.
        return fn(name, t, generator(), spec.strength, out=t)

    return write_streamed(source, dest, transform)


def _roles(source: str | Path) -> dict:
    """Checkpoint name -> ``TensorRole`` for every quantized tensor (empty for a float checkpoint)."""
    qconfig = quantization_config(source)
    if not qconfig:
        return {}
    roles = {name: role_of(qconfig, name, h.dtype) for name, h in read_headers(source).items()}
    return {name: role for name, role in roles.items() if role is not None}


def damaged(source: str | Path, strength: float, cache: Path = DEFAULT_CACHE) -> Path:
    """B heavily damaged: seeded gaussian noise of ``strength`` times each tensor's spread,
    streamed like B (config and tokenizer files copied)."""
    spec = PerturbSpec(name="gaussian", seed=7, strength=strength)
    key = hashlib.sha256(f"{fingerprint(source)}|damaged|{spec}|{_recipe(source)}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-damaged-{key}"
    if _complete(dest):
        return dest
    return _write_perturbed(source, dest, spec)


def with_control(source: str | Path, control: ControlSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B': ``source`` with one tensor scaled by ``control.scale`` (a quantized checkpoint's
    integer or fp8 codes, which scaling would leave as they are or push off their grid, are
    moved one step instead)."""
    key = hashlib.sha256(f"{fingerprint(source)}|{control}|{_recipe(source)}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-control-{key}"
    if _complete(dest):
        return dest  # made (and its tensor checked) before, from the same source
    from harness.checkpoints.perturb import scale

    headers = read_headers(source)
    if control.tensor not in headers:
        close = sorted(n for n in headers if n.split(".")[-1] == str(control.tensor).split(".")[-1])[:5]
        raise CheckpointError(
            f"positive-control tensor {control.tensor!r} is not in {source}; e.g. {close or sorted(headers)[:5]}"
        )
    role = _roles(source).get(control.tensor)
    if role is not None and role.role != "scale":
        import torch

        from harness.checkpoints.perturb import perturb_role

        gen = torch.Generator().manual_seed(0)
        return write_streamed(
            source, dest, lambda name, t: perturb_role(role, t, gen, 0.0) if name == control.tensor else t
        )
    return write_streamed(
        source, dest, lambda name, t: scale(name, t, None, control.scale - 1.0, out=t) if name == control.tensor else t
    )
