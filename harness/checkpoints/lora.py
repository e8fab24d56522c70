"""LoRA adapters A, B and B' for the LoRA paths: PEFT directories (``adapter_config.json`` and
``adapter_model.safetensors``), given by the user or written deterministically for the model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from harness.checkpoints.read import fingerprint, read_headers
from harness.errors import CheckpointError
from harness.settings import DEFAULT_CACHE
from harness.spec.checkpoint_set import PEFT_PREFIX, CheckpointSet
from harness.spec.run import ControlSpec, PerturbSpec

TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
)
"""Linear layers the harness's adapter adapts, where the model has them (Phi-3 fuses q/k/v and gate/up)."""
RANK = 8
"""The harness's adapter rank."""
ALPHA = 16
"""Its ``lora_alpha`` (scale alpha / rank = 2)."""
_STD = 0.2  # large enough that adapter A and B decode different greedy tokens on the tiny models
_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def adapter_rank(directory: str | Path) -> int:
    """``r`` of a PEFT adapter directory (one-line error when it is not one)."""
    config = Path(directory) / "adapter_config.json"
    try:
        return int(json.loads(config.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{directory} is not a PEFT adapter directory ({config}: {type(exc).__name__})") from None


def default_adapter(model: str | Path, seed: int = 0, cache: Path = DEFAULT_CACHE) -> Path:
    """A deterministic rank-8 adapter for ``model``: every 2-D linear weight of the checkpoint whose
    module is one of ``TARGET_MODULES`` gets lora_A [r, in] and lora_B [out, r], drawn from a
    seeded normal (not PEFT's zero-initialized B: the adapter must change what the model decodes)."""
    headers = read_headers(model)
    targets = {
        name: h
        for name, h in headers.items()
        if name.endswith(".weight") and len(h.shape) == 2 and name.split(".")[-2] in TARGET_MODULES
    }
    if not targets:
        raise CheckpointError(f"{model} has no linear layer a LoRA adapter can target ({', '.join(TARGET_MODULES)})")
    recipe = json.dumps(
        {"model": fingerprint(model), "seed": seed, "rank": RANK, "alpha": ALPHA, "std": _STD}, sort_keys=True
    )
    dest = cache / "adapters" / f"lora-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if (dest / "adapter_model.safetensors").is_file():
        return dest
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(targets):
        out_features, in_features = targets[name].shape
        dtype = getattr(torch, _DTYPES.get(targets[name].dtype, "float32"))
        module = PEFT_PREFIX + name.removesuffix(".weight")
        tensors[module + ".lora_A.weight"] = (_STD * torch.randn(RANK, in_features, generator=gen)).to(dtype)
        tensors[module + ".lora_B.weight"] = (_STD * torch.randn(out_features, RANK, generator=gen)).to(dtype)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": sorted({n.split(".")[-2] for n in targets}),
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": str(Path(model).resolve()),
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def prepare_adapters(
    model: str,
    lora: str | None,
    lora_target: str | None,
    perturb: PerturbSpec,
    sabotage: bool,
    cache: Path = DEFAULT_CACHE,
) -> CheckpointSet:
    """Adapters A (``--lora`` or the harness's own), B (``--lora-target`` or A perturbed in every
    tensor) and B' (B with one adapter tensor scaled: the positive control)."""
    from harness.checkpoints.prepare import prepare

    a = Path(lora) if lora else default_adapter(model, cache=cache)
    adapter_rank(a)
    if lora_target:
        adapter_rank(lora_target)
    return prepare(str(a), lora_target, perturb, ControlSpec(), cache=cache, sabotage=sabotage)
