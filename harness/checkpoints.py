"""Checkpoints A, B and B' (the positive control) as safetensors directories.

Works on any Hugging Face style directory, one file or sharded with an index (or a hub
id, resolved through ``huggingface_hub`` and its cache). Config and tokenizer files are
copied. B and B' are written tensor by tensor into shards laid out exactly like the
source's (same files, same header, same offsets: a perturbation keeps dtype and shape),
so the extra memory is about one tensor, never the whole model. Derived checkpoints are
cached by a key over the source files and the recipe, so repeated runs reuse them.

Everything checked before an engine starts (names, shapes, dtypes of a ``--target``; the
automatic choice of the control tensor) reads only the safetensors headers: no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from harness import safetensors_files
from harness.checkpoint_set import CheckpointSet  # noqa: F401  (plain data, kept importable from here)
from harness.perturb import RECIPE as PERTURB_RECIPE  # torch-free: a cached B is found without torch
from harness.spec import ControlSpec, PerturbSpec

DEFAULT_CACHE = Path(os.environ.get("REFIT_HARNESS_CACHE", Path.home() / ".cache" / "refit-harness"))
_INDEX = safetensors_files.INDEX


class CheckpointError(ValueError):
    """A checkpoint directory is missing or unreadable (a usage error, exit 2)."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as a safetensors header describes it (read without loading it)."""

    dtype: str
    """safetensors dtype code, e.g. ``F32``, ``BF16``, ``I64``."""
    shape: tuple[int, ...]
    """Tensor shape."""
    file: str
    """Name of the shard file holding it."""


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index names, or every one."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {d}")
    if not safetensors_files.files(d):
        raise CheckpointError(f"no *.safetensors files in checkpoint directory: {d}")
    if not (d / "config.json").is_file():
        raise CheckpointError(f"no config.json in checkpoint directory: {d}")
    if (d / _INDEX).is_file():
        try:
            shards = sorted(set(json.loads((d / _INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"unreadable {d / _INDEX}: {exc}") from None
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise CheckpointError(f"{d / _INDEX} names shard {missing[0]!r}, which is not in {d}")
        return [d / s for s in shards]
    return safetensors_files.files(d)


def _raw_header(file: Path) -> tuple[int, dict]:
    """(header length, header dict) of one safetensors file."""
    try:
        return safetensors_files.read_header(file)
    except safetensors_files.UnreadableFile as exc:
        raise CheckpointError(str(exc)) from None


def read_headers(directory: str | Path) -> dict[str, TensorHeader]:
    """Every tensor of a checkpoint, from the file headers alone."""
    out: dict[str, TensorHeader] = {}
    for f in weight_files(directory):
        for name, h in safetensors_files.tensor_entries(_raw_header(f)[1]):
            out[name] = TensorHeader(dtype=h["dtype"], shape=tuple(h["shape"]), file=f.name)
    return out


def check_target(a: str | Path, b: str | Path) -> None:
    """B must have A's tensors: same names, shapes and dtypes. Raises naming the first mismatch."""
    ha, hb = read_headers(a), read_headers(b)
    for name in sorted(ha.keys() | hb.keys()):
        if name not in hb:
            raise CheckpointError(f"--target {b} has no tensor {name!r} (A has it, {ha[name].dtype} {list(ha[name].shape)})")
        if name not in ha:
            raise CheckpointError(f"--target {b} has tensor {name!r}, which A does not have")
        if (ha[name].shape, ha[name].dtype) != (hb[name].shape, hb[name].dtype):
            raise CheckpointError(f"--target {b}: tensor {name!r} is {hb[name].dtype} {list(hb[name].shape)}, "
                                  f"A's is {ha[name].dtype} {list(ha[name].shape)}")


def resolve_model(path_or_hub_id: str, allow_hub: bool = True) -> Path:
    """A local checkpoint directory as is; otherwise a hub id (``org/name``) fetched through
    ``huggingface_hub`` into its cache (config, weights, tokenizer only)."""
    p = Path(path_or_hub_id)
    if p.exists() or not allow_hub or path_or_hub_id.startswith((".", "/", "~")) \
            or not re.fullmatch(r"[\w.-]+/[\w.-]+", path_or_hub_id):
        if not p.is_dir():
            raise CheckpointError(f"checkpoint directory not found: {p}")
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_hub_id, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"]))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated...: one line, exit 2
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path_or_hub_id!r} is not a directory, and fetching it as a hub id failed: "
                              f"{type(exc).__name__}: {first}"[:400]) from None


def load_weights(directory: str | Path) -> dict:
    """Every tensor at once: for tests and tiny models only (B and B' are streamed)."""
    return dict(safetensors_files.tensors(weight_files(directory)))


def fingerprint(directory: str | Path) -> str:
    """Cheap identity of a checkpoint: names, sizes and mtimes of its files."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def write_streamed(source: str | Path, dest: Path, transform: Callable[[str, object], object]) -> Path:
    """Write ``dest`` as ``source`` with every tensor passed through ``transform(name, t)``,
    one tensor at a time, in sorted name order (so a seeded transform is reproducible).

    ``t`` is a fresh tensor read for the transform alone: it may change it in place and
    return it. Each shard keeps the source's file name, header and offsets (``transform``
    must keep dtype and shape), and the index is copied. The tensor is read with plain file
    reads, not ``safe_open``, whose tensors stay mapped until the file is closed: so the
    peak extra memory is one tensor (plus what the transform allocates), never the model.
    """
    import torch

    files = weight_files(source)
    tmp = _staging_copy(source, dest)
    layout = {}  # name -> (source file, output file, data start, header entry)
    with ExitStack() as stack:
        for f in files:
            n, header = _raw_header(f)
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
                raise CheckpointError(f"transform changed {name}: {dtype} {list(shape)} -> "
                                      f"{after.dtype} {list(after.shape)}")
            raw = after.contiguous().reshape(-1).view(torch.uint8).numpy()  # a view: no copy
            begin, end = entry["data_offsets"]
            assert raw.nbytes == end - begin, (name, raw.nbytes, end - begin)
            out.seek(data_start + begin)
            out.write(raw.data)
            del before, after, raw
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # atomic: a half-written checkpoint never looks complete
    return dest


def _complete(dest: Path) -> bool:
    return dest.is_dir() and (dest / "config.json").is_file() and any(dest.glob("*.safetensors"))


def own_tokenizer(directory: str | Path):
    """The checkpoint's own fast tokenizer (``tokenizer.json``, read with the ``tokenizers``
    library: no torch, no network), or None when it ships none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust library raises a bare Exception on a bad file
        raise CheckpointError(f"cannot read the checkpoint's tokenizer {path}: {exc}") from None


def vocab_size(directory: str | Path) -> int | None:
    """The model's vocabulary size from its config.json (multimodal configs nest it in
    ``text_config``); None when the config does not say."""
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def _staging_copy(source: str | Path, dest: Path) -> Path:
    """A fresh ``<dest>.tmp`` holding ``source``'s non-weight files (config, tokenizer, index);
    renamed to ``dest`` once its weights are written, so a half-written one never looks complete."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in Path(source).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, tmp / f.name)
    return tmp


def without_tensor(source: str | Path, name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """``source`` with one tensor left out: the checkpoint a refit that skips it would read.
    The other tensors' bytes are copied as they are, in chunks (no torch, no whole tensor)."""
    key = hashlib.sha256(f"{fingerprint(source)}|without|{name}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-without-{key}"
    if _complete(dest):
        return dest
    tmp = _staging_copy(source, dest)
    index = tmp / _INDEX
    if index.is_file():
        content = json.loads(index.read_text())
        content.get("weight_map", {}).pop(name, None)
        index.write_text(json.dumps(content, indent=2))
    for f in weight_files(source):
        n, header = _raw_header(f)
        kept = [(k, v) for k, v in safetensors_files.tensor_entries(header) if k != name]  # in data order
        metadata = safetensors_files.METADATA
        offset, new_header = 0, ({metadata: header[metadata]} if metadata in header else {})
        for k, v in kept:
            size = v["data_offsets"][1] - v["data_offsets"][0]
            new_header[k] = {**v, "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(new_header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
        with open(f, "rb") as src, open(tmp / f.name, "wb") as out:
            out.write(struct.pack("<Q", len(raw)) + raw)
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
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # atomic: a half-written checkpoint never looks complete
    return dest


_COPY_CHUNK_BYTES = 64 << 20


def perturbed(source: str | Path, spec: PerturbSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B: ``source`` with ``spec`` applied to every tensor."""
    key = hashlib.sha256(f"{fingerprint(source)}|{spec}|{PERTURB_RECIPE}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-B-{key}"
    if _complete(dest):
        return dest  # before importing torch: that import is most of a cached prepare (profiled)
    return _write_perturbed(source, dest, spec)


def _write_perturbed(source: str | Path, dest: Path, spec: PerturbSpec) -> Path:
    import torch

    from harness.perturb import PERTURBATIONS

    fn = PERTURBATIONS.get(spec.name)
    gen = torch.Generator().manual_seed(spec.seed)
    # In place: write_streamed's tensor is ours, so no second copy of the largest tensor.
    return write_streamed(source, dest, lambda name, t: fn(name, t, gen, spec.strength, out=t))


def damaged(source: str | Path, strength: float, cache: Path = DEFAULT_CACHE) -> Path:
    """B heavily damaged: seeded gaussian noise of ``strength`` times each tensor's spread,
    streamed like B (config and tokenizer files copied)."""
    spec = PerturbSpec(name="gaussian", seed=7, strength=strength)
    key = hashlib.sha256(f"{fingerprint(source)}|damaged|{spec}|{PERTURB_RECIPE}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-damaged-{key}"
    if _complete(dest):
        return dest
    return _write_perturbed(source, dest, spec)


def with_control(source: str | Path, control: ControlSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B': ``source`` with one tensor scaled by ``control.scale``."""
    key = hashlib.sha256(f"{fingerprint(source)}|{control}|{PERTURB_RECIPE}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-control-{key}"
    if _complete(dest):
        return dest  # made (and its tensor checked) before, from the same source
    from harness.perturb import scale

    headers = read_headers(source)
    if control.tensor not in headers:
        close = sorted(n for n in headers if n.split(".")[-1] == str(control.tensor).split(".")[-1])[:5]
        raise CheckpointError(
            f"positive-control tensor {control.tensor!r} is not in {source}; e.g. {close or sorted(headers)[:5]}"
        )
    return write_streamed(source, dest, lambda name, t: scale(name, t, None, control.scale - 1.0, out=t)
                          if name == control.tensor else t)


_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
# Preferred norm modules, best first: each scales a whole layer's activations, and a norm
# kernel reads its weight as a tensor on every backend (not through an opaque handle).
_NORM_PREFERENCE = ("post_attention_layernorm", "input_layernorm", "pre_feedforward_layernorm", "norm",
                    "pre_mixer_norm")
_EXPERT = re.compile(r"\.experts?\.|shared_expert")


def choose_control_tensor(headers: dict[str, TensorHeader]) -> tuple[str, str]:
    """The tensor B' scales when the user names none, and why: a 1-D norm weight of the
    earliest layer (read directly by a kernel, moves every output), else the final norm,
    else a 1-D tensor of the earliest layer, else its first floating weight (seen through
    the kernel probes). Expert weights come last: a token may route around them."""
    floats = {n: h for n, h in headers.items() if h.dtype in _FLOAT_DTYPES}
    if not floats:
        raise CheckpointError("the checkpoint has no floating-point tensor to use as the positive control")

    def layer(name: str) -> int:
        m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
        return int(m.group(1)) if m else 1 << 30

    def module_leaf(name: str) -> str:
        parts = name.split(".")
        return parts[-2] if len(parts) >= 2 else ""

    def norm_rank(name: str) -> int:
        leaf = module_leaf(name)
        return _NORM_PREFERENCE.index(leaf) if leaf in _NORM_PREFERENCE else len(_NORM_PREFERENCE)

    norms = [n for n, h in floats.items() if len(h.shape) == 1 and n.endswith(".weight")
             and "norm" in module_leaf(n) and not _EXPERT.search(n)]
    in_layers = [n for n in norms if layer(n) < 1 << 30]
    if in_layers:
        best = min(in_layers, key=lambda n: (layer(n), norm_rank(n), n.count("."), n))
        return best, (f"automatic: the {module_leaf(best)} weight of the earliest layer ({layer(best)}); a norm "
                      "kernel reads it directly as a tensor and it scales the whole layer's activations")
    if norms:
        best = min(norms, key=lambda n: (norm_rank(n), n))
        return best, ("automatic: no per-layer norm weight in the checkpoint; the final norm weight, which a norm "
                      "kernel reads directly and every output passes through")
    vectors = [n for n, h in floats.items() if len(h.shape) == 1 and not _EXPERT.search(n)]
    if vectors:
        best = min(vectors, key=lambda n: (layer(n), n))
        return best, "automatic: no norm weight in the checkpoint; the earliest 1-D tensor (a bias or scale)"
    best = min(floats, key=lambda n: (bool(_EXPERT.search(n)), layer(n), "embed" in n, n))
    return best, ("automatic: no 1-D tensor in the checkpoint; the earliest weight matrix, seen through the "
                  "kernel probes")


def prepare(model: str, target: str | None, perturb: PerturbSpec, control: ControlSpec,
            cache: Path = DEFAULT_CACHE, sabotage: bool = False, damage: float | None = None) -> CheckpointSet:
    """Resolve A (a directory or a hub id), check or make B, and make B' (and B without the
    control tensor, for sabotaged refits; B damaged by ``damage``, for the accuracy probe)."""
    a = resolve_model(model)
    headers = read_headers(a)
    if target:
        b = resolve_model(target)
        check_target(a, b)
    else:
        b = perturbed(a, perturb, cache)
    if control.tensor:
        tensor, reason = control.tensor, "given with --control-tensor"
    else:
        tensor, reason = choose_control_tensor(headers)
        control = ControlSpec(tensor=tensor, scale=control.scale)
    b_control = with_control(b, control, cache)
    b_without = str(without_tensor(b, tensor, cache).resolve()) if sabotage else None
    b_damaged = str(damaged(b, damage, cache).resolve()) if damage is not None else None
    return CheckpointSet(a=str(Path(a).resolve()), b=str(Path(b).resolve()), b_control=str(b_control.resolve()),
                         control_tensor=tensor, control_reason=reason, b_without_control=b_without,
                         b_damaged=b_damaged)


# ---- the embedded default model -------------------------------------------------

TINY_QWEN3 = dict(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # CPU attention rejects head_dim 16
    max_position_embeddings=512, attention_bias=True, tie_word_embeddings=False,
    rms_norm_eps=1e-6, rope_theta=10000.0,
)


def tiny_qwen3(seed: int = 0, architecture: str | None = None, cache: Path = DEFAULT_CACHE) -> Path:
    """A tiny Qwen3 checkpoint (QK-norm included), built deterministically from ``seed``.

    Norm weights are drawn around 1 rather than left at ones, so a stale copy of a
    norm differs from the refreshed value. ``architecture`` renames the model class in
    config.json, which is how planted-bug fixture models are selected.
    """
    arch = architecture or "Qwen3ForCausalLM"
    recipe = json.dumps({"seed": seed, "arch": arch, **TINY_QWEN3}, sort_keys=True)
    dest = cache / "models" / f"tiny-qwen3-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if (dest / "model.safetensors").is_file():
        return dest
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**TINY_QWEN3)
    hf_model = Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    hf_model.save_pretrained(str(tmp), safe_serialization=True)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
