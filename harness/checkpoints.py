"""Checkpoints A, B and B' (the positive control) as safetensors directories.

Works on any Hugging Face style directory: config and tokenizer files are copied,
weights are read from every ``*.safetensors`` file and written as one file.
Derived checkpoints are cached by a key over the source files and the recipe,
so repeated runs reuse them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.spec import ControlSpec, PerturbSpec

DEFAULT_CACHE = Path(os.environ.get("REFIT_HARNESS_CACHE", Path.home() / ".cache" / "refit-harness"))


class CheckpointError(ValueError):
    """A checkpoint directory is missing or unreadable (a usage error, exit 2)."""


@dataclass(frozen=True)
class CheckpointSet:
    """The three checkpoints an oracle run needs."""

    a: str
    """Directory of checkpoint A (the starting weights)."""
    b: str
    """Directory of checkpoint B (the refit target); differs from A in every tensor."""
    b_control: str
    """Directory of B' = B with ``control_tensor`` scaled: the planted difference."""
    control_tensor: str
    """Checkpoint name of the tensor scaled in B'."""
    b_without_control: str | None = None
    """B with ``control_tensor`` left out, for sabotaged refits (None unless asked for):
    a refit from it leaves that one tensor where it was."""

    def directory(self, key: str) -> str:
        return {"A": self.a, "B": self.b, "B_control": self.b_control}[key]


def weight_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {d}")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in checkpoint directory: {d}")
    if not (d / "config.json").is_file():
        raise CheckpointError(f"no config.json in checkpoint directory: {d}")
    return files


def load_weights(directory: str | Path) -> dict:
    from safetensors.torch import load_file

    weights: dict = {}
    for f in weight_files(directory):
        weights.update(load_file(str(f)))
    return weights


def fingerprint(directory: str | Path) -> str:
    """Cheap identity of a checkpoint: names, sizes and mtimes of its files."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def write_derived(source: str | Path, dest: Path, weights: dict) -> Path:
    """Write ``weights`` as a checkpoint beside copies of ``source``'s non-weight files."""
    from safetensors.torch import save_file

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in Path(source).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.endswith(".safetensors.index.json"):
            shutil.copy2(f, tmp / f.name)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # atomic: a half-written checkpoint never looks complete
    return dest


def vocab_size(directory: str | Path) -> int | None:
    """The model's vocabulary size from its config.json (multimodal configs nest it in
    ``text_config``); None when the config does not say."""
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def without_tensor(source: str | Path, name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """``source`` with one tensor left out: the checkpoint a refit that skips it would read."""
    key = hashlib.sha256(f"{fingerprint(source)}|without|{name}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-without-{key}"
    if (dest / "model.safetensors").is_file():
        return dest
    weights = load_weights(source)
    weights.pop(name)
    return write_derived(source, dest, weights)


def perturbed(source: str | Path, spec: PerturbSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B: ``source`` with ``spec`` applied to every tensor."""
    key = hashlib.sha256(f"{fingerprint(source)}|{spec}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-B-{key}"
    if (dest / "model.safetensors").is_file():
        return dest  # before importing torch: that import is most of a cached prepare (profiled)
    import torch

    from harness.perturb import PERTURBATIONS

    fn = PERTURBATIONS.get(spec.name)
    gen = torch.Generator().manual_seed(spec.seed)
    weights = load_weights(source)
    out = {name: fn(name, t, gen, spec.strength) for name, t in sorted(weights.items())}
    return write_derived(source, dest, out)


def with_control(source: str | Path, control: ControlSpec, cache: Path = DEFAULT_CACHE) -> Path:
    """B': ``source`` with one tensor scaled by ``control.scale``."""
    key = hashlib.sha256(f"{fingerprint(source)}|{control}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(source).name}-control-{key}"
    if (dest / "model.safetensors").is_file():
        return dest  # made (and its tensor checked) before, from the same source
    from harness.perturb import scale

    weights = load_weights(source)
    if control.tensor not in weights:
        close = sorted(n for n in weights if n.split(".")[-1] == control.tensor.split(".")[-1])[:5]
        raise CheckpointError(
            f"positive-control tensor {control.tensor!r} is not in {source}; e.g. {close or sorted(weights)[:5]}"
        )
    weights[control.tensor] = scale(control.tensor, weights[control.tensor], None, control.scale - 1.0)
    return write_derived(source, dest, weights)


def prepare(model: str, target: str | None, perturb: PerturbSpec, control: ControlSpec,
            cache: Path = DEFAULT_CACHE, sabotage: bool = False) -> CheckpointSet:
    """Resolve A, make or check B, and make B' (and B without the control tensor, for
    sabotaged refits)."""
    weight_files(model)
    b = Path(target) if target else perturbed(model, perturb, cache)
    weight_files(b)
    b_control = with_control(b, control, cache)
    b_without = str(without_tensor(b, control.tensor, cache).resolve()) if sabotage else None
    return CheckpointSet(a=str(Path(model).resolve()), b=str(Path(b).resolve()),
                         b_control=str(b_control.resolve()), control_tensor=control.tensor,
                         b_without_control=b_without)


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
