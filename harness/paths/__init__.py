"""Reload paths: one class per kind of refit, one module per family of paths. Each class
registers itself where it is defined, with ``@reload_path``; the modules are imported on the
first lookup, and none of them imports vLLM at import time (only inside ``refit``).

Third-party paths come from installed packages through the ``refit_harness.paths`` entry-point
group (``name = "module:Class"``); each is checked when it is registered, and one that breaks the
contract (``docs/adding-a-path.md``) is refused with a one-line reason instead of being run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from harness.errors import UsageError
from harness.registry import Registry
from harness.settings import EXTRA_PATHS_ENV
from harness.spec.architectures import named_targets
from harness.spec.path_declaration import SabotageEvidence

if TYPE_CHECKING:
    from harness.paths.base import ReloadPath

BUILTIN_MODULES = (
    "reload_weights",
    "weight_transfer",
    "http_reload",
    "http_transfer",
    "trainer_steps",
    "sharded_state",
    "engine_states",
    "raw_load_weights",
    "lora",
    "replay",
)
"""The modules of ``harness.paths`` that define built-in paths, in the order ``--paths all`` lists them."""
ENTRY_POINT_GROUP = "refit_harness.paths"
"""The entry-point group an installed package registers its reload paths in."""


class PathRefused(UsageError):
    """A reload path that breaks the contract (no sabotaged twin, a wrong name...)."""


def contract_violation(name: str, cls: Any) -> str | None:
    """Why ``cls`` cannot be registered as the reload path ``name`` (None: it can). The one
    rule that matters most: a path must bring its sabotaged twin, or its PASS proves nothing."""
    from harness.paths.base import ReloadPath
    from harness.spec.requirements import EngineRequirements

    if not (isinstance(cls, type) and issubclass(cls, ReloadPath)):
        return f"{cls!r} is not a subclass of harness.paths.base.ReloadPath"
    if getattr(cls, "name", None) != name:
        return f"its class says name = {getattr(cls, 'name', None)!r}, but it is registered as {name!r}"
    if not getattr(cls, "exercises", "").strip():
        return "it does not say which vLLM code path it exercises (set `exercises`)"
    if cls.sabotaged_refit is ReloadPath.sabotaged_refit:
        return (
            "it has no sabotaged twin: override sabotaged_refit() (the refit with its one essential step "
            "skipped or broken) and say what it breaks in `sabotage`"
        )
    if cls.sabotage_evidence not in get_args(SabotageEvidence):
        return (
            f"sabotage_evidence must be one of {', '.join(get_args(SabotageEvidence))}, not {cls.sabotage_evidence!r}"
        )
    if not isinstance(cls.requirements, EngineRequirements):
        return "its requirements are not an harness.spec.requirements.EngineRequirements"
    if (
        not cls.refit_targets
        or cls.refit_targets[0] != "B"
        or not cls.sabotage_targets
        or cls.sabotage_targets[0] != "B"
    ):
        return "its refit_targets and sabotage_targets must start with 'B' (the refit that is judged)"
    return None


class PathRegistry(Registry["type[ReloadPath]"]):
    """The reload-path registry: built-ins register with ``@reload_path`` as their modules are
    imported (on the first lookup, so listing names never imports vLLM) and are held to the
    contract by the tests; third-party classes are checked as they register."""

    def __init__(self) -> None:
        super().__init__("reload path", populate=self._populate_all)
        self.refused: dict[str, str] = {}
        """Third-party paths that were refused, with the one-line reason."""
        self.third_party: dict[str, str] = {}
        """Name -> distribution that registered it."""

    def _populate_all(self) -> None:
        for module in BUILTIN_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        self.load_entry_points()

    def register_class(self, name: str, cls: Any, target: str | None = None) -> None:
        """Register a path class, checked now: a contract violation raises ``PathRefused``."""
        target = target or f"{cls.__module__}:{cls.__qualname__}"
        why = contract_violation(name, cls)
        if why:
            raise PathRefused(f"reload path {name!r} ({target}) is refused: {why}")
        self.register(name, target)
        self._loaded[name] = cls

    def load_entry_points(self) -> None:
        """Register every installed package's paths, then those ``REFIT_HARNESS_PATHS`` names
        (tried without installing); a refused one is kept in ``refused``."""
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "?"
            self._register_third_party(ep.name, ep.value, f"from {dist}", dist, ep.load)
        try:
            named = named_targets(EXTRA_PATHS_ENV, os.environ.get(EXTRA_PATHS_ENV), "path")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        for name, target in named.items():
            self._register_third_party(name, target, f"from {EXTRA_PATHS_ENV}", EXTRA_PATHS_ENV, _loader(target))

    def _register_third_party(self, name: str, target: str, origin: str, source: str, load) -> None:
        """Check and register one third-party class; ``source`` is what ``paths`` says it came from."""
        if name in self.refused or name in self.third_party:
            return
        try:
            if name in self._targets:
                raise PathRefused(
                    f"reload path {name!r} ({target}, {origin}) is refused: the name is taken by {self._targets[name]}"
                )
            self.register_class(name, load(), target)
            self.third_party[name] = source
        except PathRefused as exc:
            self.refused[name] = str(exc)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            self.refused[name] = (
                f"reload path {name!r} ({target}, {origin}) is refused: importing it failed: "
                f"{type(exc).__name__}: {first}"[:400]
            )

    def get(self, name: str) -> Any:
        self._ready()
        if name in self.refused:
            raise PathRefused(self.refused[name])
        return super().get(name)


def _loader(target: str):
    """A ``module:Class`` target's loader, as an entry point's ``load``."""

    def load() -> Any:
        module, _, qualname = target.partition(":")
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found

    return load


PATHS = PathRegistry()

P = TypeVar("P", bound="type[ReloadPath]")


def reload_path(cls: P) -> P:
    """Class decorator: register a path under its ``name``."""
    PATHS.register(cls.name, f"{cls.__module__}:{cls.__qualname__}")
    return cls
