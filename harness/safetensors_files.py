"""The one reader (and header writer) of safetensors files: headers in pure Python (no torch,
before any engine), tensors through ``safetensors.safe_open`` (torch imported only when
tensors are read).

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
``data_offsets`` relative to the end of the header; plus an optional ``__metadata__``), then
the data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from harness.errors import UnreadableFile

INDEX = "model.safetensors.index.json"
METADATA = "__metadata__"
_MAX_HEADER = 100 << 20  # a larger "length" is a corrupt file, not a header to read


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


def encode_header(header: dict[str, Any]) -> bytes:
    """The bytes that start a file with this header: its 8-byte length, then the JSON,
    padded with spaces so the data begins 8-byte aligned (as safetensors writes it)."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def tensor_entries(header: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, entry) of every tensor a header describes, in the order their bytes lie in the
    file (the order ``safetensors.torch.load_file`` returns them)."""
    return sorted(
        ((name, entry) for name, entry in header.items() if name != METADATA),
        key=lambda item: (item[1]["data_offsets"][0], item[0]),
    )


def files(directory: str | Path) -> list[Path]:
    """The safetensors files of a directory, in name order."""
    return sorted(Path(directory).glob("*.safetensors"))


def tensors(
    paths: Iterable[str | Path], exclude: Iterable[str] = (), only: Iterable[str] | None = None, device: str = "cpu"
) -> Iterator[tuple[str, Any]]:
    """(name, torch tensor) of every tensor in ``paths``, file by file, one tensor read at a
    time, in ``tensor_entries`` order; without ``exclude``, and only ``only`` when given."""
    from safetensors import safe_open

    skip, keep = frozenset(exclude), None if only is None else frozenset(only)
    for f in paths:
        names = [
            name for name, _ in tensor_entries(read_header(f)[1]) if name not in skip and (keep is None or name in keep)
        ]
        with safe_open(str(f), framework="pt") as sf:
            for name in names:
                yield name, sf.get_tensor(name).to(device)


def torch_dtype(code: str):
    """The torch dtype of a safetensors dtype code (``F32``, ``BF16``, ``I64``...)."""
    import torch

    names = {
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "F64": "float64",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U64": "uint64",
        "U32": "uint32",
        "U16": "uint16",
        "U8": "uint8",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
        "C64": "complex64",
    }
    dtype = getattr(torch, names.get(code, ""), None)
    if dtype is None:
        raise UnreadableFile(f"safetensors dtype {code!r} has no torch dtype here (torch {torch.__version__})")
    return dtype


def read_tensor(fh: BinaryIO, data_start: int, entry: dict[str, Any]):
    """One tensor of an open safetensors file, read into a fresh contiguous torch tensor that
    the caller owns (one copy, freed with it). Unlike ``safe_open``, nothing stays mapped
    after it: a tensor from ``safe_open`` lives in the file's mapping, which is released only
    when the file is closed, so a writer that keeps its sources open holds every tensor read."""
    import torch

    begin, end = entry["data_offsets"]
    t = torch.empty(entry["shape"], dtype=torch_dtype(entry["dtype"]))
    raw = t.reshape(-1).view(torch.uint8).numpy()  # the tensor's own memory
    if raw.nbytes != end - begin:
        raise UnreadableFile(
            f"{getattr(fh, 'name', 'file')}: a {entry['dtype']} {entry['shape']} tensor "
            f"has {end - begin} bytes in the header"
        )
    fh.seek(data_start + begin)
    view, done = memoryview(raw), 0
    while done < raw.nbytes:  # readinto may return less than asked
        n = fh.readinto(view[done:])
        if not n:
            raise UnreadableFile(f"{getattr(fh, 'name', 'file')} ends inside a tensor")
        done += n
    return t
