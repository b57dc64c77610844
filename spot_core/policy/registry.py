"""Strategies registered by name, so configuration (a DAG argument, a CLI flag, a Prefect
block field) can choose one with a string and a typo fails with the list of valid names."""

from __future__ import annotations

from typing import Generic, TypeVar

from spot_core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> strategy (a frozen policy object or a pure function), with a default."""

    def __init__(self, kind: str, default: str = "default") -> None:
        self.kind = kind
        self.default = default
        self._items: dict[str, T] = {}

    def register(self, name: str, value: T, *, replace: bool = False) -> T:
        if name in self._items and not replace:
            raise ConfigError(f"{self.kind} {name!r} is already registered; pick another name "
                              "or pass replace=True")
        self._items[name] = value
        return value

    def get(self, name: str | None = None) -> T:
        """The strategy called ``name`` (the default when None)."""
        key = self.default if name is None else name
        try:
            return self._items[key]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {key!r}; choose one of "
                              f"{', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
