"""Plugins named by installed packages' entry points: listed by name, loaded on first use.

spot-pipelines is extended, and extends itself, through entry-point groups, as Airflow
(``apache_airflow_provider``) and Prefect (``prefect.collections``) are:

- ``spot_pipelines.providers``: capacity providers (``spot_core.providers.registry``);
- ``spot_pipelines.detectors``: interruption notice detectors
  (``spot_core.interruption.registry``);
- ``spot_pipelines.deadline_policies``: deadline policies (``spot_core.policy.registry``);
- ``spot_pipelines.demos``: the engines' demos (``spot-pipelines demo --engine``).

The built-in providers and detectors are entries of this package's own ``pyproject.toml``
like any other, so a third-party package joins by one line of its own. A group is read
once per process, by name only (nothing is imported to list it); an entry is imported
when it is first asked for, and an entry that cannot be imported is one ``ConfigError``
line naming the fix.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from spot_core.errors import ConfigError

T = TypeVar("T")

OWN_DISTRIBUTION = "spot-pipelines"


@functools.cache
def named(group: str) -> dict[str, EntryPoint]:
    """The group's entry points by name: this package's own first, then every other
    package's, each by name (a wheel's entry points are written sorted, so declaration
    order is lost: a registry that needs another order says which). When two packages
    use one name, this package's wins, then the first by package name."""
    found = list(entry_points(group=group))
    own = sorted(
        (ep for ep in found if _distribution(ep) == OWN_DISTRIBUTION), key=lambda ep: ep.name
    )
    others = sorted(
        (ep for ep in found if _distribution(ep) != OWN_DISTRIBUTION),
        key=lambda ep: (ep.name, _distribution(ep) or ""),
    )
    by_name: dict[str, EntryPoint] = {}
    for entry in own + others:
        by_name.setdefault(entry.name, entry)
    return by_name


def _distribution(entry: EntryPoint) -> str | None:
    dist = getattr(entry, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return None if name is None else name.replace("_", "-").lower()


def load(group: str, entry: EntryPoint, kind: str) -> Any:
    """Import ``entry`` (a class is instantiated with no arguments); one line naming the
    fix if it cannot be."""
    try:
        value = entry.load()
        return value() if isinstance(value, type) else value
    except Exception as exc:  # noqa: BLE001 - any import error, said in one line
        raise ConfigError(
            f"{kind} {entry.name!r} ({entry.value}, entry point group {group}) could not be "
            f"loaded: {type(exc).__name__}: {exc}; install its package in this environment "
            "or fix the entry point"
        ) from None


class Registry(Generic[T]):
    """One group's plugins by name: listed without an import, each imported once, on first
    use, and checked to be an ``expected`` (a ``ProviderPlugin``, a ``DetectorPlugin``).

    ``unknown(name, names)``: the one-line refusal of a name nobody registered.
    ``bind(plugin, name)``: the plugin as it answers to ``name`` (a provider takes the name
    it is registered under)."""

    def __init__(
        self,
        group: str,
        kind: str,
        expected: type[T],
        unknown: Callable[[str, tuple[str, ...]], str],
        bind: Callable[[T, str], T] | None = None,
    ) -> None:
        self.group, self.kind, self.expected = group, kind, expected
        self._unknown, self._bind = unknown, bind
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    def names(self) -> tuple[str, ...]:
        """Every registered name, in ``named``'s order."""
        return tuple(named(self.group))

    def get(self, name: str) -> T:
        with self._lock:
            found = self._loaded.get(name)
            if found is not None:
                return found
            entry = named(self.group).get(name)
            if entry is None:
                raise ConfigError(self._unknown(name, self.names()))
            value = load(self.group, entry, self.kind)
            if not isinstance(value, self.expected):
                raise ConfigError(
                    f"{self.kind} {name!r} ({entry.value}) is not a "
                    f"{self.expected.__name__}; point the entry point at one"
                )
            plugin: T = value if self._bind is None else self._bind(value, name)
            self._loaded[name] = plugin
            return plugin
