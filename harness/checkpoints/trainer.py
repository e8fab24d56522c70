"""The trainer paths' targets: the live trainer's weights after each optimizer step, saved
once with ``save_pretrained`` and cached, so every per-step cold start reads them.

The training itself runs on the engine side (``python -m harness.machinery.trainer``, torch and
transformers), in a process of its own: the parent only starts it and names its output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from harness.checkpoints.quantize import describe_quantization, quantization_config, quantizes_weights
from harness.checkpoints.read import fingerprint
from harness.errors import CheckpointError
from harness.settings import DEFAULT_CACHE
from harness.spec.run import TrainerSpec

SAVED_LAYOUT = "checkpoint-layout-v2"
"""What a saved step's files are, part of its cache key: v2 sends and saves the checkpoint's
layout (transformers 5's load-time conversions reverted) and keeps A's KV-scale config. Change
it whenever the files the trainer writes change."""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def trainer_steps(
    model: str, spec: TrainerSpec, prompts: tuple[tuple[int, ...], ...], steps: int, cache: Path = DEFAULT_CACHE
) -> tuple[str, ...]:
    """Directories ``T1``..``T<steps>``: checkpoint A trained ``k`` steps, cached by everything
    a step depends on (A's bytes, the trainer's recipe, the prompts, torch and transformers).

    A pre-quantized A is refused (``CheckpointError``, so the trainer paths are SKIPPED): a
    transformers trainer dequantizes it, and ``save_pretrained`` writes its steps as float
    weights under A's quantized config, which is no checkpoint of that format (measured with
    the fp8 W8A8 family: fp32 ``weight`` beside ``weight_scale``). RL trainers of quantized
    engines send float weights to an online-quantized engine: the ``online`` families."""
    if quantizes_weights(qconfig := quantization_config(model)):
        raise CheckpointError(
            f"{model} is pre-quantized ({describe_quantization(qconfig)}): a transformers trainer dequantizes it and "
            "would save its steps as float weights under the quantized config, no checkpoint of that format"
        )
    recipe = {
        "a": fingerprint(model),
        "spec": asdict(spec),
        "prompts": [list(p) for p in prompts],
        "steps": steps,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "saved": SAVED_LAYOUT,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    dest = cache / "derived" / f"trainer-{key}"
    dirs = tuple(str(dest / f"T{k}") for k in range(1, steps + 1))
    if (dest / "trainer.json").is_file() and all((Path(d) / "config.json").is_file() for d in dirs):
        return dirs
    cmd = [
        sys.executable,
        "-m",
        "harness.machinery.trainer",
        model,
        str(dest),
        "--steps",
        str(steps),
        "--spec",
        json.dumps(asdict(spec)),
        "--prompts",
        json.dumps([list(p) for p in prompts]),
    ]
    (dest / "trainer.json").unlink(missing_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CheckpointError(f"the trainer could not train {model} ({steps} steps): {tail[0][:300]}")
    return dirs
