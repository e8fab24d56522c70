"""Versioned records on disk.

Every file carries ``schema_version``; ``load`` refuses files from a newer harness and
upgrades older ones through ``_MIGRATIONS`` (none yet: this is version 1).
Frozen dataclasses round-trip through plain JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

SCHEMA_VERSION = 1
T = TypeVar("T")

# version N -> function upgrading a payload from N to N+1
_MIGRATIONS: dict[int, typing.Callable[[dict], dict]] = {}


class SchemaError(ValueError):
    """A record on disk cannot be read by this harness."""


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:
        return "NaN"
    return obj


def from_jsonable(tp: Any, data: Any) -> Any:
    """Rebuild a value of type ``tp`` (dataclasses, tuples, optionals) from JSON data."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {f.name: from_jsonable(hints[f.name], data[f.name])
                  for f in dataclasses.fields(tp) if f.name in data}
        return tp(**kwargs)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_jsonable(options[0], data) if len(options) == 1 else data
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], x) for x in data)
        return tuple(from_jsonable(a, x) for a, x in zip(args, data))
    if tp is float and data == "NaN":
        return float("nan")
    return data


def dump(obj: Any, path: Path, kind: str) -> Path:
    """Write ``obj`` atomically as ``{"schema_version", "kind", "data"}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    payload = {"schema_version": SCHEMA_VERSION, "kind": kind, "data": to_jsonable(obj)}
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=False))
    os.replace(tmp, path)
    return path


def load(tp: type[T], path: Path, kind: str) -> T:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"cannot read {path}: {exc}") from exc
    version = payload.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise SchemaError(f"{path}: schema_version {version!r} is not readable by this harness "
                          f"(reads up to {SCHEMA_VERSION})")
    if payload.get("kind") != kind:
        raise SchemaError(f"{path}: expected a {kind!r} record, found {payload.get('kind')!r}")
    while version < SCHEMA_VERSION:
        payload = _MIGRATIONS[version](payload)
        version += 1
    return from_jsonable(tp, payload["data"])
