"""Every fork between the vLLM versions the harness runs on, in one module, chosen by feature
detection: what the installed vLLM has, never its version number (main moves between releases,
and a PR build carries the last release's number).

The forks, and where each one appeared:

- **Moved names** (``MOVED``): ``check_enough_kv_cache_memory`` left ``v1/core/kv_cache_utils``
  for ``v1/core/kv_cache_planning`` (0.33); ``FrontendArgs`` left ``entrypoints/launchers`` for
  ``entrypoints/common`` (0.33). Each is resolved from its candidate modules, newest first.
- **The trainer-side ``WeightSource``** (0.33): ``metadata`` became a
  ``functools.cached_property`` (``WeightSource.__init_subclass__`` raises ``TypeError`` at class
  creation otherwise), iteration became ``iter_full()`` / ``iter_local()``, and the m2n trainer
  takes any source with ``iter_local`` (``m2n_source.M2NWeightSource`` and ``M2NParamMeta``'s
  ``placements`` are gone). ``weight_source_base`` gives the harness one base class either way.
- **The reload lifecycle** (0.34): ``start_reload`` / ``finish_reload`` dispatch on
  ``VLLM_RELOAD_MODE`` (``layerwise`` or the new ``direct``); before, the layerwise pair was the
  only lifecycle.
- **The m2n trainer's rendezvous** (0.33): ``m2n_trainer.trainer_init`` became
  ``stateless_init_metadata_group``; preflight stops a dry run there.

Engine side, and importable without vLLM: only the standard library at import time, vLLM inside
each function. ``harness.builds.engine_fields`` runs ``resolve`` under a build's own interpreter,
and ``python -m harness.worker.vllm_compat`` prints the API check (``api_check``) as JSON, which
``preflight --build`` asks of every build.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.errors import VllmApiError
from harness.spec.engine_config import RELOAD_MODE_ENV, RELOAD_MODES


@dataclass(frozen=True)
class MovedName:
    """A vLLM name that has lived in more than one module."""

    name: str
    """The attribute's name (the same in every module)."""
    modules: tuple[str, ...]
    """The modules it has lived in, newest first."""
    used_for: str
    """What the harness uses it for."""


MOVED: dict[str, MovedName] = {
    m.name: m
    for m in (
        MovedName(
            "check_enough_kv_cache_memory",
            ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"),
            "preflight: vLLM's own KV-cache size check for a GPU arm",
        ),
        MovedName(
            "FrontendArgs",
            ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"),
            "builds: the `vllm serve` options that are not engine arguments",
        ),
        MovedName(
            "M2NWeightSource",
            ("vllm.distributed.weight_transfer.m2n_source",),
            "the m2n trainer's source before 0.33 (later, any source with iter_local)",
        ),
        MovedName(
            "start_reload",
            ("vllm.model_executor.model_loader.reload",),
            "the reload lifecycle of 0.34+ (layerwise or direct)",
        ),
    )
}

VERSION_SPECIFIC = frozenset({"M2NWeightSource", "start_reload"})
"""Moved names that only some versions have: their absence picks the other fork, it is not a
missing API."""


def module_exists(dotted: str) -> bool:
    """Whether ``dotted`` can be imported here, asked parent by parent (``find_spec`` of a child
    imports its parent, and raises if the parent itself is missing)."""
    parts = dotted.split(".")
    return all(importlib.util.find_spec(".".join(parts[: i + 1])) is not None for i in range(len(parts)))


def locate(name: str) -> str | None:
    """The first module of ``MOVED[name]`` that exists and holds the name, or None."""
    for module in MOVED[name].modules:
        if module_exists(module) and hasattr(importlib.import_module(module), name):
            return module
    return None


def resolve(name: str) -> Any:
    """A moved vLLM name, from wherever the installed vLLM keeps it."""
    module = locate(name)
    if module is None:
        raise VllmApiError(f"the installed vLLM has no {name} (looked in {', '.join(MOVED[name].modules)})")
    return getattr(importlib.import_module(module), name)


# --- the trainer-side WeightSource ---------------------------------------------------------


def weight_source_api() -> str:
    """``"full-local"`` (0.33+: a cached ``metadata``, ``iter_full``/``iter_local``) or
    ``"iterable"`` (0.32: ``metadata()`` and ``__iter__``)."""
    from vllm.distributed.weight_transfer.base import WeightSource

    return "full-local" if hasattr(WeightSource, "iter_full") else "iterable"


class SourceHooks:
    """What a harness source implements, whatever vLLM's ``WeightSource`` asks for."""

    def param_metas(self) -> list[Any]:
        """Every tensor's ``ParamMeta``, in sending order."""
        raise NotImplementedError

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` in the order of ``param_metas``, each whole."""
        raise NotImplementedError


@functools.cache
def weight_source_base() -> type:
    """The base class of the harness's weight sources, for the installed vLLM's ``WeightSource``.

    A source implements ``SourceHooks``; the base maps them onto vLLM's protocol. On 0.33+ the
    whole tensors are also each rank's local piece (``iter_local``): one trainer rank holds every
    tensor whole, replicated, which is what the m2n trainer reshards."""
    from vllm.distributed.weight_transfer.base import WeightSource

    if weight_source_api() == "full-local":

        def metadata(self):
            return self.param_metas()

        metadata.__name__ = "metadata"  # cached_property keys its cache on the attribute name

        def iter_whole(self):
            return self.tensors()

        namespace = {"metadata": functools.cached_property(metadata), "iter_full": iter_whole, "iter_local": iter_whole}
    else:
        namespace = {"metadata": lambda self: self.param_metas(), "__iter__": lambda self: self.tensors()}
    return type("HarnessWeightSource", (SourceHooks, WeightSource), namespace)


def source_metadata(source: Any) -> list[Any]:
    """A ``WeightSource``'s metadata, read the way the installed vLLM defines it."""
    return source.metadata if weight_source_api() == "full-local" else source.metadata()


def source_tensors(source: Any) -> Iterator[tuple[str, Any]]:
    """A ``WeightSource``'s whole tensors, iterated the way the installed vLLM defines it."""
    return source.iter_full() if weight_source_api() == "full-local" else iter(source)


def m2n_source_class(base: type) -> type:
    """The source the m2n trainer takes, over the harness's checkpoint source class ``base``.

    Before 0.33 it must be an ``M2NWeightSource``: a ``(1, 1)`` mesh and ``M2NParamMeta``
    entries, every tensor ``REPLICATED``. From 0.33 the trainer builds its own ``M2NParamMeta``
    (``m2n_param_meta``) from any source with ``iter_local``, so ``base`` serves as it is."""
    if locate("M2NWeightSource") is None:
        return base
    from vllm.distributed.weight_transfer.m2n_common import REPLICATED, M2NMesh, M2NParamMeta

    m2n_weight_source = resolve("M2NWeightSource")

    def mesh(self):
        return M2NMesh((1, 1), 0)

    def metadata(self):
        return [M2NParamMeta(m.name, m.dtype, m.shape, REPLICATED) for m in self.param_metas()]

    return type(f"M2N{base.__name__}", (base, m2n_weight_source), {"mesh": mesh, "metadata": metadata})


def m2n_rendezvous_target() -> str:
    """The m2n trainer module's function that opens its rendezvous (a dry run stops there)."""
    from vllm.distributed.weight_transfer import m2n_trainer

    return "trainer_init" if hasattr(m2n_trainer, "trainer_init") else "stateless_init_metadata_group"


# --- the reload lifecycle ------------------------------------------------------------------


def supported_reload_modes() -> tuple[str, ...]:
    """The reload modes the installed vLLM has (``VLLM_RELOAD_MODE`` is 0.34+)."""
    import vllm.envs

    return RELOAD_MODES if RELOAD_MODE_ENV in vllm.envs.environment_variables else RELOAD_MODES[:1]


def start_reload(model: Any) -> None:
    """Begin a checkpoint-format weight update, as vLLM's own transfer engines begin one."""
    if locate("start_reload") is not None:
        resolve("start_reload")(model)
    else:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(model)


def finish_reload(model: Any, model_config: Any, device: Any) -> None:
    """Complete the update ``start_reload`` began (0.34 reruns every module's post-load hook)."""
    if locate("start_reload") is not None:
        from vllm.model_executor.model_loader.reload import finish_reload as finish

        finish(model, model_config, device)
    else:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(model, model_config)


def eager_while_recording() -> Any:
    """A context in which the recorded engine step runs: ``torch.compiler.set_stance("force_eager")``
    where vLLM's CPU runner samples through ``torch.compile(fullgraph=True)`` functions (0.34's
    standalone CPU model runner: measured, the step under the recorder's dispatch mode raised
    "torch.compile with fullgraph=True found no compiled frames" and broke the engine), else
    nothing, so older runners' recorded steps run exactly as before."""
    import contextlib

    from vllm.platforms import current_platform

    standalone = getattr(current_platform, "uses_standalone_cpu_model_runner", None)
    if callable(standalone) and standalone():
        import torch

        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


# --- the API check -------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiName:
    """One vLLM name the harness uses, and whether the installed vLLM has it."""

    name: str
    """``module:attribute`` (or a module alone) as the harness imports it, or a moved name."""
    used_in: str
    """The harness module that uses it first (or ``vllm_compat`` for a moved name)."""
    found: str | None
    """Where the installed vLLM has it; None: missing."""


def _static_imports(root: Path) -> dict[tuple[str, str], str]:
    """Every ``from vllm... import x`` and ``import vllm...`` in the harness's sources but this
    module (whose version-specific names are ``MOVED``): ``(module, name) -> first user``."""
    found: dict[tuple[str, str], str] = {}
    for file in sorted(root.rglob("*.py")):
        if file.name == Path(__file__).name and file.parent.name == "worker":
            continue
        user = ".".join(file.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                for alias in node.names:
                    found.setdefault((node.module, alias.name), user)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm":
                        found.setdefault((alias.name, ""), user)
    return found


def _has(module: str, name: str) -> bool:
    if not module_exists(module):
        return False
    if not name:
        return True
    return hasattr(importlib.import_module(module), name) or module_exists(f"{module}.{name}")


def api_check(root: Path | None = None) -> list[ApiName]:
    """Every vLLM name the harness imports, and every moved name, resolved against the installed
    vLLM. A version-specific name that is absent is not listed as missing: it picks a fork."""
    root = root or Path(__file__).resolve().parents[1]
    out = [
        ApiName(f"{module}:{name}" if name else module, user, module if _has(module, name) else None)
        for (module, name), user in sorted(_static_imports(root).items())
    ]
    for name in sorted(MOVED):
        where = locate(name)
        if where is not None or name not in VERSION_SPECIFIC:
            out.append(ApiName(name, "harness.worker.vllm_compat", where))
    return out


def missing(names: list[ApiName]) -> list[ApiName]:
    """The names the installed vLLM lacks."""
    return [n for n in names if n.found is None]


if __name__ == "__main__":
    import vllm

    checked = api_check()
    print(
        "REFIT_HARNESS_API "
        + json.dumps(
            {
                "vllm": vllm.__version__,
                "weight_source_api": weight_source_api(),
                "reload_modes": list(supported_reload_modes()),
                "names": [asdict(n) for n in checked],
            }
        )
    )
