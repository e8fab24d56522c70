"""Where a checkpoint comes from: a local directory, or a hub id fetched through
``huggingface_hub`` into its cache (config, weights and tokenizer only)."""

from __future__ import annotations

import re
from pathlib import Path

from harness.errors import CheckpointError


def resolve_model(path_or_hub_id: str, allow_hub: bool = True) -> Path:
    """A local checkpoint directory as is; otherwise a hub id (``org/name``) fetched through
    ``huggingface_hub`` into its cache (config, weights, tokenizer only)."""
    p = Path(path_or_hub_id)
    if (
        p.exists()
        or not allow_hub
        or path_or_hub_id.startswith((".", "/", "~"))
        or not re.fullmatch(r"[\w.-]+/[\w.-]+", path_or_hub_id)
    ):
        if not p.is_dir():
            raise CheckpointError(f"checkpoint directory not found: {p}")
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                path_or_hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"]
            )
        )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path_or_hub_id!r} is not a directory, and fetching it as a hub id failed: {type(exc).__name__}: {first}"[
                :400
            ]
        ) from None
