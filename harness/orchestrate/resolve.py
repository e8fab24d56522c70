"""The run's spec made concrete for this checkpoint and this machine: the default prompts (through
the checkpoint's own tokenizer), a KV cache sized from its config, and which paths cannot run
here. The run (``execute``) and its preflight both resolve through here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from harness.checkpoints.read import image_token_id, vocab_size
from harness.errors import UsageError
from harness.spec.kv_cache import kv_cache_bytes
from harness.spec.prompts import PROMPT_QUESTIONS, shared_prefix_prompts, text_prompts, with_images
from harness.spec.run import RunSpec
from harness.tokenizer import own_tokenizer

DEFAULT_VOCAB = 256  # prompts for a checkpoint whose config names no vocabulary


def resolve_prompts(spec: RunSpec) -> RunSpec:
    """The spec with its prompts made concrete when the user gave none, so the default
    prompts fit any checkpoint: real text through the checkpoint's own tokenizer where it
    has one, else token ids drawn from the model's vocabulary; for a checkpoint that takes
    images, one image placeholder in each (``with_images``)."""
    if spec.prompts.token_ids is not None:
        return spec
    vocab = vocab_size(spec.model) or DEFAULT_VOCAB
    tokenizer = own_tokenizer(spec.model)
    made = text_prompts(lambda text: tokenizer.encode(text, add_special_tokens=False).ids, vocab) if tokenizer else None
    token_ids, texts = made if made else (shared_prefix_prompts(vocab), None)
    prompts = replace(spec.prompts, token_ids=token_ids, texts=texts)
    image_token = image_token_id(spec.model)
    if image_token is not None:
        placed, seeds = with_images(token_ids, image_token)
        shown = tokenizer.id_to_token(image_token) if tokenizer else f"<{image_token}>"
        prompts = replace(
            prompts,
            token_ids=placed,
            images=seeds,
            # Shown before each question: where the ids place it, after the (cut) passage.
            texts=tuple(t[: -len(q)] + shown + " " + q for t, q in zip(texts, PROMPT_QUESTIONS)) if texts else None,
        )
    return replace(spec, prompts=prompts)


def resolve_engine(spec: RunSpec, model_dir: str) -> RunSpec:
    """The spec with a KV cache sized from the model's own config where it asks for that
    (``EngineSpec.kv_cache_memory_bytes`` None): every sequence of ``max_num_seqs`` at
    ``max_model_len``, with a margin (``harness.spec.kv_cache``)."""
    if spec.engine.kv_cache_memory_bytes is not None:
        return spec
    config_file = Path(model_dir) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot size the KV cache from {config_file}: {type(exc).__name__}: {exc}") from None
    e = spec.engine
    try:
        size = kv_cache_bytes(config, e.dtype, e.max_model_len, e.max_num_seqs)
    except ValueError as exc:
        raise UsageError(f"cannot size the KV cache of {model_dir}: {exc}") from None
    return replace(spec, engine=replace(e, kv_cache_memory_bytes=size))


def unavailable_paths(
    classes: dict, tensor_parallel_size: int, gpus: int | None, cuda: bool | None = None, packages: bool = True
) -> dict[str, str]:
    """Why each path that cannot run here cannot: the path's own reason (no CUDA, a missing
    package), or, on a machine with ``gpus`` GPUs, more GPUs than it has (its engine's and a
    transfer trainer's own). ``cuda`` and ``packages`` as in ``ReloadPath.unavailable_reason``."""
    out = {}
    for name, cls in classes.items():
        reason = cls.unavailable_reason(cuda, packages)
        needed = cls.gpus_needed(tensor_parallel_size)
        if reason is None and gpus is not None and needed > gpus:
            reason = (
                f"{name} needs {needed} GPUs here (TP {tensor_parallel_size}"
                + (" and a trainer GPU of its own" if needed > tensor_parallel_size else "")
                + f"); this machine has {gpus} (REFIT_HARNESS_GPUS or nvidia-smi)"
            )
        if reason:
            out[name] = reason
    return out
