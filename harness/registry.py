"""One strict, lazy registry per plug-in kind.

Entries are registered as ``"module:attribute"`` strings and imported only when
looked up, so listing names never imports vLLM. A duplicate name raises; an
unknown name answers with what exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from harness.errors import UnknownName

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> lazily imported object, for one kind of plug-in."""

    def __init__(self, kind: str, populate: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._targets: dict[str, str] = {}
        self._loaded: dict[str, T] = {}
        self._populate = populate
        """Called once, before the first lookup: imports the modules whose definitions register
        themselves (e.g. with a decorator), so listing names never needs them up front."""

    def _ready(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate()

    def register(self, name: str, target: str) -> None:
        if name in self._targets:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._targets[name]})")
        if ":" not in target:
            raise ValueError(f"{self.kind} target must be 'module:attribute', got {target!r}")
        self._targets[name] = target

    def names(self) -> tuple[str, ...]:
        self._ready()
        return tuple(self._targets)

    def __contains__(self, name: object) -> bool:
        self._ready()
        return name in self._targets

    def target(self, name: str) -> str:
        """The ``module:attribute`` string registered under ``name`` (nothing imported)."""
        self._check(name)
        return self._targets[name]

    def _check(self, name: str) -> None:
        self._ready()
        if name not in self._targets:
            raise UnknownName(f"unknown {self.kind} {name!r}. Available: {sorted(self._targets)}")

    def get(self, name: str) -> T:
        self._check(name)
        if name not in self._loaded:
            module_name, _, attr = self._targets[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module_name), attr)
        return self._loaded[name]
