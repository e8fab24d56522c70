"""Reload paths: one class per kind of refit, one module per family of paths. Each class
registers itself where it is defined, with ``@reload_path``; the modules are imported on the
first lookup, and none of them imports vLLM at import time (only inside ``refit``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

from harness.registry import Registry

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
)
"""The modules of ``harness.paths`` that define built-in paths, in the order ``--paths all`` lists them."""


def _import_builtin_paths() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"{__name__}.{module}")


PATHS: Registry[type[ReloadPath]] = Registry("reload path", populate=_import_builtin_paths)

P = TypeVar("P", bound="type[ReloadPath]")


def reload_path(cls: P) -> P:
    """Class decorator: register a path under its ``name``."""
    PATHS.register(cls.name, f"{cls.__module__}:{cls.__qualname__}")
    return cls
