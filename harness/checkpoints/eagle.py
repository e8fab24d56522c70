"""EAGLE drafter heads for a checkpoint (``--drafter eagle``).

An EAGLE head is a checkpoint of its own: ``fc`` (the target's embedding and hidden state,
concatenated, mapped back to the hidden size) and one decoder layer; it shares the target's
embedding and ``lm_head`` (vLLM gives it the target's modules). An RL loop that trains the head
must refit it beside the target, and ``reload_weights`` reaches the target only.

The harness writes one head per checkpoint, made from that checkpoint's own tensors: its layer is
a copy of the target's last decoder layer, and ``fc`` passes the hidden state through. So A's, B's
and B''s heads differ exactly as their targets' last layers do, and a cold engine on B drafts
with B's head: a refit that leaves the head at A leaves tensors the census tells apart. The head
is derived, never trained: its acceptance rate means nothing beyond "equal to cold B's", and the
census, not the rate, is what shows a stale head.

vLLM 0.32 runs EAGLE (method ``eagle``) for Llama-family targets (``EagleLlamaForCausalLM``,
chosen by prefixing the target's architecture); other architectures are refused by vLLM at
start-up, in its words.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness import safetensors_files
from harness.cache import cached_variant
from harness.checkpoints.read import fingerprint
from harness.errors import CheckpointError
from harness.settings import DEFAULT_CACHE

RECIPE = "eagle-last-layer-v1"
"""The heads' recipe version: part of each head's cache key."""

HEAD_LAYER = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)
"""The head layer's tensors, by their name inside a decoder layer. No ``input_layernorm``: vLLM's
EAGLE Llama replaces layer 0's with an identity."""


def eagle_head(checkpoint: str | Path, cache: Path = DEFAULT_CACHE) -> Path:
    """The EAGLE head of ``checkpoint`` (written once, then cached by the checkpoint's fingerprint)."""
    key = hashlib.sha256(f"{fingerprint(checkpoint)}|{RECIPE}".encode()).hexdigest()[:16]
    dest = cache / "derived" / f"{Path(checkpoint).name}-eagle-{key}"
    return cached_variant(dest, lambda staging: _write_head(Path(checkpoint), staging), _complete)


def _complete(dest: Path) -> bool:
    return (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()


def _write_head(checkpoint: Path, staging: Path) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((checkpoint / "config.json").read_text())
    last = config.get("num_hidden_layers", 0) - 1
    wanted = {f"model.layers.{last}.{leaf}": f"layers.0.{leaf}" for leaf in HEAD_LAYER}
    head = {wanted[name]: t for name, t in safetensors_files.tensors(safetensors_files.files(checkpoint), only=wanted)}
    missing = sorted(set(wanted.values()) - set(head))
    if last < 0 or missing:
        raise CheckpointError(
            f"{checkpoint}: no EAGLE head can be made from it (a Llama-style decoder layer has {', '.join(HEAD_LAYER)};"
            f" missing {', '.join(missing) or 'num_hidden_layers'})"
        )
    hidden = config["hidden_size"]
    dtype = head["layers.0.self_attn.q_proj.weight"].dtype
    # [embedding | hidden state] -> hidden state: the target's hidden state passes through.
    head["fc.weight"] = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1).to(dtype)
    (staging / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 1}, indent=2))
    save_file(head, str(staging / "model.safetensors"))
