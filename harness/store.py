"""Versioned records on disk.

Every file carries ``schema_version``; ``load`` refuses files from a newer harness and
upgrades older ones through ``_MIGRATIONS`` (none yet: this is version 1).
Frozen dataclasses round-trip through plain JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
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


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write a file so that a reader (or a crash, or a full disk) sees it whole or not at all.

    The temp name is unique (the arm's watchdog thread and its main thread can both write the
    same record), the bytes are fsynced before the rename, and the directory after it, so a
    power cut cannot leave a renamed but empty file. A failed write removes its temp file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600; reports are shared like any other file
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _umask_file_mode() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


_FILE_MODE = _umask_file_mode()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def dump(obj: Any, path: Path, kind: str) -> Path:
    """Write ``obj`` atomically as ``{"schema_version", "kind", "data"}``."""
    payload = {"schema_version": SCHEMA_VERSION, "kind": kind, "data": to_jsonable(obj)}
    return write_atomic(path, json.dumps(payload, indent=1, sort_keys=False))


def load(tp: type[T], path: Path, kind: str) -> T:
    """Read a record; anything this harness cannot read (truncated, unknown version, wrong
    structure) is a ``SchemaError`` naming the file, never a bare KeyError or TypeError."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"cannot read {path}: {exc}") from exc
    if not isinstance(payload, dict):
        raise SchemaError(f"{path}: not a refit-harness record (a JSON {type(payload).__name__})")
    version = payload.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise SchemaError(f"{path}: schema_version {version!r} is not readable by this harness "
                          f"(reads 1 to {SCHEMA_VERSION})")
    if payload.get("kind") != kind:
        raise SchemaError(f"{path}: expected a {kind!r} record, found {payload.get('kind')!r}")
    while version < SCHEMA_VERSION:
        payload = _MIGRATIONS[version](payload)
        version += 1
    try:
        return from_jsonable(tp, payload["data"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise SchemaError(f"{path}: a {kind!r} record of version {version} with the wrong structure "
                          f"({type(exc).__name__}: {exc})") from exc
