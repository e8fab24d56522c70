"""The one reader of safetensors files: headers in pure Python (no torch, before any engine),
tensors through ``safetensors.safe_open`` (torch imported only when tensors are read).

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
``data_offsets`` relative to the end of the header; plus an optional ``__metadata__``), then
the data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

INDEX = "model.safetensors.index.json"
METADATA = "__metadata__"
_MAX_HEADER = 100 << 20  # a larger "length" is a corrupt file, not a header to read


class UnreadableFile(ValueError):
    """A file that is not a readable safetensors file."""


def read_header(file: str | Path) -> tuple[int, dict[str, Any]]:
    """(header length, header dict) of one safetensors file, ``__metadata__`` included."""
    try:
        with open(file, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _MAX_HEADER:
                raise ValueError(f"header of {n} bytes")
            return n, json.loads(fh.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise UnreadableFile(f"{file} is not a readable safetensors file: {exc}") from None


def tensor_entries(header: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, entry) of every tensor a header describes, in the order their bytes lie in the
    file (the order ``safetensors.torch.load_file`` returns them)."""
    return sorted(((name, entry) for name, entry in header.items() if name != METADATA),
                  key=lambda item: (item[1]["data_offsets"][0], item[0]))


def files(directory: str | Path) -> list[Path]:
    """The safetensors files of a directory, in name order."""
    return sorted(Path(directory).glob("*.safetensors"))


def tensors(paths: Iterable[str | Path], exclude: Iterable[str] = (), only: Iterable[str] | None = None,
            device: str = "cpu") -> Iterator[tuple[str, Any]]:
    """(name, torch tensor) of every tensor in ``paths``, file by file, one tensor read at a
    time, in ``tensor_entries`` order; without ``exclude``, and only ``only`` when given."""
    from safetensors import safe_open

    skip, keep = frozenset(exclude), None if only is None else frozenset(only)
    for f in paths:
        names = [name for name, _ in tensor_entries(read_header(f)[1])
                 if name not in skip and (keep is None or name in keep)]
        with safe_open(str(f), framework="pt") as sf:
            for name in names:
                yield name, sf.get_tensor(name).to(device)


def torch_dtype(code: str):
    """The torch dtype of a safetensors dtype code (``F32``, ``BF16``, ``I64``...)."""
    import torch

    return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
            "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
            "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[code]
