"""Versioned records on disk.

Every file carries ``schema_version``; ``load`` refuses files from a newer harness and
upgrades older ones through the registered ``MIGRATIONS`` (at the end of this module).
Frozen dataclasses are written as plain JSON and validated on load by pydantic over the
same dataclasses: a missing field, an unknown one, or a value of the wrong type (``"abc"``
for a tuple) is a ``SchemaError``, never a half-built record.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from harness.cache import write_atomic  # the one atomic file writer; kept importable from here
from harness.errors import SchemaError

SCHEMA_VERSION = 4
T = TypeVar("T")

Migration = Callable[[dict], dict]
MIGRATIONS: dict[int, Migration] = {}
"""version N -> the function upgrading a whole payload (``schema_version``, ``kind``,
``data``) from N to N+1; it returns the payload with ``schema_version`` N+1."""
OLDEST_READABLE = 1
"""Version 0 predates the record format and has no migration."""


def migration(version: int) -> Callable[[Migration], Migration]:
    """Register the upgrade of a payload from ``version`` to ``version + 1``."""

    def register(upgrade: Migration) -> Migration:
        if version in MIGRATIONS:
            raise ValueError(f"a migration from schema version {version} is already registered")
        MIGRATIONS[version] = upgrade
        return upgrade

    return register


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


def _forbid_unknown_fields(tp: Any, seen: set) -> None:
    """Every dataclass reachable from ``tp`` rejects fields it does not declare (pydantic
    ignores them by default, and takes a dataclass's own config, not the adapter's)."""
    if tp in seen:
        return
    seen.add(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if "__pydantic_config__" not in vars(tp):
            tp.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")  # type: ignore[attr-defined]
        for hint in typing.get_type_hints(tp).values():
            _forbid_unknown_fields(hint, seen)
    for arg in typing.get_args(tp):
        _forbid_unknown_fields(arg, seen)


@functools.cache
def _adapter(tp: Any) -> pydantic.TypeAdapter:
    _forbid_unknown_fields(tp, set())
    return pydantic.TypeAdapter(tp)


def from_jsonable(tp: type[T], data: Any) -> T:
    """Validate JSON data as a ``tp`` (dataclasses, tuples, optionals, literals; ``"NaN"`` for
    a float). Raises ``pydantic.ValidationError`` naming every field that is wrong."""
    return _adapter(tp).validate_python(data)  # type: ignore[arg-type]  # a dataclass type is hashable


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
    if not isinstance(version, int) or isinstance(version, bool) or not OLDEST_READABLE <= version <= SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: schema_version {version!r} is not readable by this harness "
            f"(reads {OLDEST_READABLE} to {SCHEMA_VERSION})"
        )
    if payload.get("kind") != kind:
        raise SchemaError(f"{path}: expected a {kind!r} record, found {payload.get('kind')!r}")
    payload = migrate(payload, path)
    if "data" not in payload:
        raise SchemaError(f"{path}: a {kind!r} record of version {version} with the wrong structure (no 'data')")
    try:
        return from_jsonable(tp, payload["data"])
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the record"
        raise SchemaError(
            f"{path}: a {kind!r} record of version {version} with the wrong structure "
            f"({exc.error_count()} error(s); first: {where}: {first['msg']})"
        ) from exc


def migrate(payload: dict, path: Path | str = "record") -> dict:
    """Upgrade a payload, one registered migration per version, to ``SCHEMA_VERSION``."""
    version = payload["schema_version"]
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise SchemaError(
                f"{path}: schema_version {version} is not readable by this harness "
                f"(no migration from version {version})"
            )
        payload = MIGRATIONS[version](payload)
        if payload.get("schema_version") != version + 1:
            raise SchemaError(
                f"{path}: the migration from schema version {version} did not produce version {version + 1}"
            )
        version += 1
    return payload


# ---- migrations ---------------------------------------------------------------------

_RANK_PREFIX = re.compile(r"rank(\d+):(.*)", re.DOTALL)


@migration(1)
def _rank_field(payload: dict) -> dict:
    """Version 2 gave census tensors, kernel inputs and unobserved records a ``rank`` field;
    version 1 wrote the rank of a multi-rank observation as a ``rank<N>:`` name prefix."""
    if payload.get("kind") == "arm_result" and isinstance(payload.get("data"), dict):
        for obs in payload["data"].get("observations") or ():
            if not isinstance(obs, dict) or (obs.get("model") or {}).get("world_size", 1) <= 1:
                continue
            for field in ("tensors", "consumed", "unobserved"):
                for record in obs.get(field) or ():
                    match = _RANK_PREFIX.fullmatch(record.get("name", "")) if isinstance(record, dict) else None
                    if match:
                        record["rank"], record["name"] = int(match[1]), match[2]
    return {**payload, "schema_version": 2}


def _observation_label(label: str) -> dict:
    path, _, stage = label.rpartition("/")
    return {"stage": stage, "path": path or None}


def _probe_label(label: str) -> dict:
    point, _, probe = label.rpartition("/")
    # A probe follows a cold start (cold_B, cold_B_damaged) or a path's refit to B; no path is named cold_*.
    after = {"stage": point, "path": None} if point.startswith("cold_") else {"stage": "warm_B", "path": point}
    return {"probe": probe, "after": after}


def _typed_step(step: dict) -> dict:
    if step.get("action") == "refit":
        return {"target": step["argument"], "path": step["path"], "sabotaged": step.get("sabotaged", False)}
    if step.get("action") in ("measure", "accuracy"):
        return {"label": _probe_label(step["argument"])}
    return {"label": _observation_label(step["argument"])}


@migration(2)
def _typed_labels(payload: dict) -> dict:
    """Version 3 typed the labels and steps: an observation's ``"<path>/<stage>"`` became
    ``{"stage", "path"}``, a probe's ``"<point>/<probe>"`` ``{"probe", "after"}``, and a step's
    ``action`` + ``argument`` (a label or a checkpoint key) one of Observe, Refit, Probe."""
    data, kind = payload.get("data"), payload.get("kind")
    if isinstance(data, dict):
        plans = [data] if kind == "arm_plan" else []
        if kind == "run_record" and isinstance(data.get("plan"), dict):
            plans = data["plan"].get("arms") or []
        for plan in plans:
            if isinstance(plan, dict) and isinstance(plan.get("steps"), list):
                plan["steps"] = [
                    _typed_step(s) if isinstance(s, dict) and isinstance(s.get("argument"), str) else s
                    for s in plan["steps"]
                ]
        if kind == "arm_result":
            for field, typed in (
                ("observations", _observation_label),
                ("measurements", _probe_label),
                ("completions", _probe_label),
            ):
                for record in data.get(field) or ():
                    if isinstance(record, dict) and isinstance(record.get("label"), str):
                        record["label"] = typed(record["label"])
    return {**payload, "schema_version": 3}


def _plans(payload: dict) -> list:
    """The arm plans a payload holds: itself (an arm plan) or a run record's."""
    data, kind = payload.get("data"), payload.get("kind")
    if not isinstance(data, dict):
        return []
    if kind == "arm_plan":
        return [data]
    if kind == "run_record" and isinstance(data.get("plan"), dict):
        return [a for a in data["plan"].get("arms") or () if isinstance(a, dict)]
    return []


@migration(3)
def _refit_segments(payload: dict) -> dict:
    """Version 4 names the segment of every refit (``Refit.segment``), so that a failure in a
    sabotaged twin's later, real refit is charged to the twin: each refit is followed by the
    observation of its segment, whose label names it."""
    for plan in _plans(payload):
        steps = plan.get("steps")
        if not isinstance(steps, list):
            continue
        for i, step in enumerate(steps):
            if not (isinstance(step, dict) and "target" in step and "segment" not in step):
                continue
            after = next(
                (s["label"] for s in steps[i + 1 :] if isinstance(s, dict) and "stage" in (s.get("label") or {})), None
            )
            step["segment"] = (after or {}).get("path") or step.get("path", "")
    return {**payload, "schema_version": 4}
