"""Reading a checkpoint directory without torch: its safetensors files and headers, its
config's vocabulary, and a cheap fingerprint. Everything checked before an engine starts
(names, shapes, dtypes of a ``--target``; the control tensor's choice) reads only headers."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness import safetensors_files
from harness.errors import CheckpointError

_INDEX = safetensors_files.INDEX


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
    if not (d / "config.json").is_file() and not (d / "adapter_config.json").is_file():  # a model or a PEFT adapter
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


def raw_header(file: Path) -> tuple[int, dict]:
    """(header length, header dict) of one safetensors file."""
    try:
        return safetensors_files.read_header(file)
    except safetensors_files.UnreadableFile as exc:
        raise CheckpointError(str(exc)) from None


def read_headers(directory: str | Path) -> dict[str, TensorHeader]:
    """Every tensor of a checkpoint, from the file headers alone."""
    out: dict[str, TensorHeader] = {}
    for f in weight_files(directory):
        for name, h in safetensors_files.tensor_entries(raw_header(f)[1]):
            out[name] = TensorHeader(dtype=h["dtype"], shape=tuple(h["shape"]), file=f.name)
    return out


def check_target(a: str | Path, b: str | Path) -> None:
    """B must have A's tensors: same names, shapes and dtypes. Raises naming the first mismatch."""
    ha, hb = read_headers(a), read_headers(b)
    for name in sorted(ha.keys() | hb.keys()):
        if name not in hb:
            raise CheckpointError(
                f"--target {b} has no tensor {name!r} (A has it, {ha[name].dtype} {list(ha[name].shape)})"
            )
        if name not in ha:
            raise CheckpointError(f"--target {b} has tensor {name!r}, which A does not have")
        if (ha[name].shape, ha[name].dtype) != (hb[name].shape, hb[name].dtype):
            raise CheckpointError(
                f"--target {b}: tensor {name!r} is {hb[name].dtype} {list(hb[name].shape)}, "
                f"A's is {ha[name].dtype} {list(ha[name].shape)}"
            )


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


def vocab_size(directory: str | Path) -> int | None:
    """The model's vocabulary size from its config.json (multimodal configs nest it in
    ``text_config``); None when the config does not say."""
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def image_token_id(directory: str | Path) -> int | None:
    """The id of the token an image takes the place of, for a checkpoint that takes images: its
    config.json names one (``image_token_id``, or LLaVA's ``image_token_index``) and it ships a
    processor; None otherwise."""
    root = Path(directory)
    config_file = root / "config.json"
    if not config_file.is_file() or not any((root / name).is_file() for name in PROCESSOR_FILES):
        return None
    config = json.loads(config_file.read_text())
    token = config.get("image_token_id", config.get("image_token_index"))
    return int(token) if token is not None else None
