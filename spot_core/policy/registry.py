"""Strategies registered by name, so configuration (a DAG argument, a CLI flag, a Prefect
block field) can choose one with a string and a typo fails with the list of valid names.

A registry may also take strategies from an entry-point group: an installed package
names its own (``[project.entry-points."spot_pipelines.deadline_policies"]``), and every
process that resolves names (the CLI, an Airflow worker or triggerer, a Prefect worker or
flow run) finds it without importing anything first. Entry points are listed by name
at once and loaded only when asked for."""

from __future__ import annotations

import threading
from importlib.metadata import EntryPoint
from typing import Generic, TypeVar

from spot_core import plugins
from spot_core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> strategy (a frozen policy object or a pure function), with a default."""

    def __init__(
        self,
        kind: str,
        default: str = "default",
        *,
        entry_point_group: str | None = None,
        method: str | None = None,
    ) -> None:
        self.kind = kind
        self.default = default
        self.entry_point_group = entry_point_group
        self.method = method  # what a loaded entry point must have (e.g. "plan")
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, name: str, value: T, *, replace: bool = False) -> T:
        if name in self._items and not replace:
            raise ConfigError(
                f"{self.kind} {name!r} is already registered; pick another name "
                "or pass replace=True"
            )
        self._items[name] = value
        return value

    def get(self, name: str | None = None) -> T:
        """The strategy called ``name`` (the default when None)."""
        key = self.default if name is None else name
        if key in self._items:
            return self._items[key]
        plugin = self._found().get(key)
        if plugin is None:
            raise ConfigError(
                f"unknown {self.kind} {key!r}; choose one of {', '.join(self.names())}"
            )
        return self._load(key, plugin)

    def names(self) -> list[str]:
        return sorted(set(self._items) | set(self._found()))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._found()

    # -- entry points ------------------------------------------------------------------------
    def _found(self) -> dict[str, EntryPoint]:
        """The group's entry points by name, read once (``get`` looks at the names
        registered in code first, so those win)."""
        if self.entry_point_group is None:
            return {}
        return plugins.named(self.entry_point_group)

    def _load(self, name: str, plugin: EntryPoint) -> T:
        """Import the entry point once (a class is instantiated with no arguments)."""
        with self._lock:
            if name in self._items:
                return self._items[name]
            assert self.entry_point_group is not None  # only named entries come here
            value: T = plugins.load(self.entry_point_group, plugin, self.kind)
            if self.method is not None and not callable(getattr(value, self.method, None)):
                raise ConfigError(
                    f"{self.kind} {name!r} ({plugin.value}) has no "
                    f"{self.method}() method; point the entry point at an "
                    f"object or class with one"
                )
            return self.register(name, value)
