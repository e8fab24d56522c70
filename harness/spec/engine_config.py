"""vLLM engine arguments as an axis of a run.

Every arm of a run (reference, noise, subjects, ``vllm serve``) is built with the harness's
own settings plus the run's *engine arguments*: any ``EngineArgs`` field, given as
``--engine-arg KEY=VALUE`` (repeatable; the value is JSON, else a plain string) or as
``--engine-config FILE.yaml`` (the keys of ``vllm serve --config``: flat or nested, dashes or
underscores). A scenario lists several of them as engine configurations, one cell group each.

They are checked before any engine starts against the ``EngineArgs`` fields of the build that
will run them (``harness.builds.engine_fields`` asks the build's interpreter for them):
an unknown key names the closest fields, a key the harness owns names the harness flag to use.

Pure: no vLLM, no torch. Values travel as JSON text so that specs stay frozen and hashable.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import UsageError

ReloadMode = Literal["layerwise", "direct"]
"""How vLLM reloads checkpoint-format weights in place (``VLLM_RELOAD_MODE``, vLLM 0.34+):
``layerwise`` rematerializes each layer's tensors and loads into them; ``direct`` views the
existing storage back to checkpoint layout, loads into it and reruns post-load processing (no
rollback; vLLM refuses it with LoRA, online quantization and sharded_rdt). Before 0.34 every
reload is layerwise, and a ``direct`` cell is SKIPPED as declined by vLLM."""
RELOAD_MODES: tuple[ReloadMode, ...] = ("layerwise", "direct")
"""Every reload mode, vLLM's default first."""
DrafterMethod = Literal["draft_model", "eagle", "mtp"]
"""The speculative-decoding drafter every engine of a run drafts with (``--drafter``): vLLM's
``draft_model``, loaded from the engine's own checkpoint (the target drafts for itself), an
``eagle`` head the harness writes per checkpoint (``harness.checkpoints.eagle``), or ``mtp``, the
multi-token-prediction layers a checkpoint carries beside its model (MiMo's ``model.mtp_layers``),
which vLLM loads into a drafter of their own."""
DRAFTERS: tuple[DrafterMethod, ...] = ("draft_model", "eagle", "mtp")
"""Every drafter, the default first."""
RELOAD_MODE_ENV = "VLLM_RELOAD_MODE"
"""The variable vLLM reads, once per process, for the reload mode."""

EngineArgs = tuple[tuple[str, str], ...]
"""Engine arguments as ``(field, JSON text of its value)`` pairs, sorted by field, each field once."""

HARNESS_OWNED: Mapping[str, str] = {
    "model": "--model (checkpoint A; --target for B)",
    "tokenizer": "--model (the harness feeds token ids and reads the checkpoint's own tokenizer)",
    "skip_tokenizer_init": "nothing: the harness feeds token ids to every arm (with the tokenizer only for image "
    "prompts, which vLLM's multimodal processor needs)",
    "dtype": "--dtype",
    "tensor_parallel_size": "--tp",
    "enforce_eager": "--mode eager|compiled",
    "seed": "nothing: every arm uses the same engine seed so that arms are comparable (--seed sets B's perturbation)",
    "worker_extension_cls": "nothing: the harness's observer is the worker extension of every arm",
    "load_format": "--paths (dummy_start and the sharded-state paths choose their load format)",
    "enable_sleep_mode": "--paths sleep_level1 or sleep_level2",
    "weight_transfer_config": "--paths transfer_* (each transfer path builds its own config)",
}
"""``EngineArgs`` fields the harness sets itself in every arm, and the harness flag to use instead."""

SERVER_ONLY_HINT = "a vllm serve server option, not an engine argument: the harness runs its own server"


@dataclass(frozen=True)
class EngineFields:
    """What a build's vLLM accepts as engine arguments (asked of its interpreter, cached per build)."""

    vllm: str
    """vLLM version of the build."""
    names: tuple[str, ...]
    """``dataclasses.fields(EngineArgs)`` names, in declaration order."""
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Fields whose type is a ``Literal`` of strings or an ``Enum`` (optionally ``| None``), with
    the values vLLM accepts (an enum's member names)."""
    server_only: tuple[str, ...] = ()
    """``vllm serve`` frontend options (host, port, api_key...): not engine arguments."""
    kinds: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Fields whose annotation tells which JSON values they take (``bool``, ``int``, ``float``,
    ``str``, ``list``, ``map``, ``null``); a field not listed (a vLLM config class, ``Any``) is
    not checked here: vLLM converts those itself."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration of a scenario: a cell-id tag and its engine arguments."""

    label: str = ""
    """Short tag added to the cell-group id (``tiny-qwen3-eager-tp1-fp8kv``); empty: none."""
    args: EngineArgs = ()
    """Engine arguments every arm of its cells is built with."""
    models: tuple[str, ...] = ()
    """Labels of the scenario's models it applies to (e.g. a KV-cache configuration for the
    models whose checkpoints carry KV scales); empty: every model."""
    expect_census: tuple[str, ...] = ()
    """Regular expressions of census names its cells must observe (``RunSpec.expected_census``):
    the derived state this configuration's kernels read, e.g. the HPC QK-norm weights."""
    devices: tuple[str, ...] = ()
    """Where it can run at all, as ``cpu``, ``cuda`` or ``sm90``-style compute capabilities
    (empty: anywhere); elsewhere its cells are SKIPPED with ``skip_reason``."""
    skip_reason: str = ""
    """Why it cannot run elsewhere (shown as the SKIPPED reason)."""
    reload_mode: ReloadMode = "layerwise"
    """vLLM's reload mode for its cells (``EngineSpec.reload_mode``)."""
    draft_tokens: int = 0
    """Speculative decoding for its cells (``EngineSpec.draft_tokens``): every engine drafts this
    many tokens a step with a drafter of its own checkpoint; 0: none."""
    drafter: DrafterMethod = "draft_model"
    """Which drafter its cells draft with (``EngineSpec.drafter``)."""
    paths: tuple[str, ...] = ()
    """The scenario's paths it runs (empty: all of them): a reload mode changes only the paths
    whose refit goes through vLLM's reload lifecycle."""
    packages: tuple[tuple[str, str], ...] = ()
    """``(module, what needs it and how to get it)`` for each Python module its engines import that
    no extra of the harness installs (Tencent's ``hpc`` for ``HPC_ATTN``). Where one cannot be
    found, as vLLM itself looks (``importlib.util.find_spec``), its cells are SKIPPED with that text."""

    def applies_to(self, model_label: str) -> bool:
        return not self.models or model_label in self.models


def missing_modules(packages: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The ``(module, why)`` pairs of ``packages`` whose module this interpreter cannot find
    (looked up without importing it, as vLLM does before it builds an HPC layer)."""
    import importlib.util

    return tuple((module, why) for module, why in packages if importlib.util.find_spec(module) is None)


def missing_modules_reason(missing: tuple[tuple[str, str], ...]) -> str:
    """The SKIPPED reason for missing engine-configuration modules."""
    return "; ".join(f"module {module} is not installed: {why}" for module, why in missing)


def normalize_key(key: str) -> str:
    """``kv-cache-dtype`` and ``kv_cache_dtype`` name the same field (as in ``vllm serve``)."""
    return key.strip().replace("-", "_")


def encode(args: Mapping[str, Any], where: str = "engine argument") -> EngineArgs:
    """Engine arguments as sorted ``(field, JSON text)`` pairs; keys normalized."""
    out: dict[str, str] = {}
    for key, value in args.items():
        name = normalize_key(str(key))
        if not name:
            raise UsageError(f"{where}: an empty key")
        try:
            out[name] = json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            raise UsageError(
                f"{where} {name}: {value!r} is not a JSON value (a string, number, bool, list or map)"
            ) from None
    return tuple(sorted(out.items()))


def decode(args: EngineArgs) -> dict[str, Any]:
    """The ``LLM(...)`` keyword arguments of encoded engine arguments."""
    return {key: json.loads(text) for key, text in args}


def merge(*layers: EngineArgs) -> EngineArgs:
    """Later layers win key by key (a config file, then ``--engine-arg`` flags on top)."""
    out: dict[str, str] = {}
    for layer in layers:
        out.update(layer)
    return tuple(sorted(out.items()))


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: the value parsed as JSON (``4``, ``false``, ``{"rope_theta": 1e6}``), else
    taken as a string (``fp8``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--engine-arg expects KEY=VALUE (e.g. kv_cache_dtype=fp8), got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return normalize_key(key), value


def load_engine_config(path: str | Path) -> dict[str, Any]:
    """The engine arguments of a ``vllm serve --config`` YAML file (a mapping of keys to values)."""
    import yaml

    file = Path(path)
    if file.suffix not in (".yaml", ".yml"):
        raise UsageError(f"--engine-config {file}: must be a .yaml or .yml file (as vllm serve --config)")
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise UsageError(f"--engine-config {file}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--engine-config {file}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--engine-config {file}: must map keys to values, got a {type(data).__name__}")
    return {normalize_key(str(k)): v for k, v in data.items()}


def from_command_line(config_file: str | None, flags: Iterable[str]) -> EngineArgs:
    """``--engine-config`` first, then each ``--engine-arg`` on top (as vllm's CLI over its config)."""
    layers = []
    if config_file:
        layers.append(encode(load_engine_config(config_file), where=f"--engine-config {config_file}:"))
    layers.append(encode(dict(parse_engine_arg(f) for f in flags), where="--engine-arg"))
    return merge(*layers)


def check_engine_args(args: EngineArgs, fields: EngineFields, build: str = "") -> None:
    """Raise ``UsageError`` (one line) at the first argument this build's vLLM would not take
    from the harness: a field the harness owns, a server-only option, an unknown field (naming
    the closest ones), or a value outside a field's choices."""
    where = f"vLLM {fields.vllm}" + (f" (build {build})" if build else "")
    known = set(fields.names)
    choices = dict(fields.choices)
    kinds = dict(fields.kinds)
    for key, text in args:
        if key in HARNESS_OWNED:
            raise UsageError(f"engine argument {key}: the harness sets it in every arm; use {HARNESS_OWNED[key]}")
        if key in fields.server_only and key not in known:
            raise UsageError(f"engine argument {key}: {SERVER_ONLY_HINT}")
        if key not in known:
            close = difflib.get_close_matches(key, fields.names, n=3, cutoff=0.6)
            hint = f"closest: {', '.join(close)}" if close else "no field has a similar name"
            raise UsageError(f"engine argument {key}: not an EngineArgs field of {where}; {hint}")
        value = json.loads(text)
        accepted = kinds.get(key)
        if (
            accepted is not None
            and json_kind(value) not in accepted
            and not (json_kind(value) == "int" and "float" in accepted)
        ):
            raise UsageError(
                f"engine argument {key}: {where} takes {' or '.join(_KIND_NAMES[k] for k in sorted(accepted)) or 'no JSON value'} "
                f"here, not {_KIND_NAMES[json_kind(value)]} {text[:80]}"
            )
        allowed = choices.get(key)
        if allowed and isinstance(value, str) and value not in allowed:
            raise UsageError(f"engine argument {key}={value}: {where} takes one of {', '.join(allowed)}")


_KIND_NAMES = {
    "bool": "a boolean",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "list": "a list",
    "map": "a map",
    "null": "null",
}


def json_kind(value: Any) -> str:
    """``bool``, ``int``, ``float``, ``str``, ``list``, ``map`` or ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "map"


def shown_items(args: EngineArgs) -> list[str]:
    """Each argument as ``key=value`` for reports (strings bare, other values as JSON)."""
    return [f"{k}={_bare(v)}" for k, v in args]


def shown(args: EngineArgs) -> str:
    """The arguments on one line for reports; ``vLLM defaults`` when there are none."""
    return " ".join(shown_items(args)) or "vLLM defaults"


def _bare(text: str) -> str:
    value = json.loads(text)
    return value if isinstance(value, str) else text
