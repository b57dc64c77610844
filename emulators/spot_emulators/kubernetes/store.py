"""Every API object of the emulated cluster, with resource versions and a watch history.

All writes go through here under one lock: each bumps the cluster-wide resourceVersion,
stores a fresh snapshot (stored dicts are never mutated afterwards, so readers can
serialise them without copying) and appends a watch event that list+watch clients and the
emulator's own controllers wake on.
"""

from __future__ import annotations

import builtins
import copy
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, already_exists, conflict, not_found
from .resources import RESOURCES
from .timefmt import rfc3339

HISTORY = 10_000  # watch events kept (older resource versions answer 410 Expired)


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


class Store:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.changed = threading.Condition()
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rv = 1000
        self._history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self.closed = False

    # -- reads ---------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def find(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((resource, namespace, name))

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        found = self.find(resource, namespace, name)
        if found is None:
            raise not_found(resource, name, RESOURCES[resource].group)
        return found

    def list(self, resource: str, namespace: str | None = None) -> tuple[list[dict[str, Any]], int]:
        with self.changed:
            items = [
                obj
                for (res, ns, _), obj in self._objects.items()
                if res == resource and (namespace is None or ns == namespace)
            ]
            return items, self._rv

    def events_after(self, rv: int, resource: str) -> builtins.list[WatchEvent]:
        """Watch events newer than ``rv``; 410 Expired when the history no longer has them."""
        with self.changed:
            if self._history and rv < self._history[0].rv - 1:
                raise ApiError(
                    410, f"too old resource version: {rv} ({self._history[0].rv - 1})", "Expired"
                )
            return [e for e in self._history if e.rv > rv and e.resource == resource]

    def wait(self, after_rv: int, timeout: float) -> None:
        with self.changed:
            if self._rv == after_rv and not self.closed:
                self.changed.wait(timeout)

    # -- writes --------------------------------------------------------------------------
    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        res = RESOURCES[resource]
        meta = obj.setdefault("metadata", {})
        key = (resource, meta.get("namespace", "") if res.namespaced else "", meta["name"])
        with self.changed:
            if key in self._objects:
                raise already_exists(resource, meta["name"], res.group)
            obj["kind"], obj["apiVersion"] = res.kind, res.api_version
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", rfc3339(self.clock()))
            return self._put(key, obj, None, "ADDED")

    def update(
        self,
        resource: str,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], Any],
        expect_rv: str | None = None,
    ) -> dict[str, Any]:
        """Apply ``mutate`` to a copy of the object and store it (one MODIFIED event, none
        if nothing changed). ``expect_rv`` is optimistic concurrency: 409 if stale."""
        key = (resource, namespace if RESOURCES[resource].namespaced else "", name)
        with self.changed:
            old = self._objects.get(key)
            if old is None:
                raise not_found(resource, name, RESOURCES[resource].group)
            if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
                raise conflict(
                    resource,
                    name,
                    "the object has been modified; please apply "
                    "your changes to the latest version and try again",
                )
            new = copy.deepcopy(old)
            mutate(new)
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            if new == old:
                return old
            return self._put(key, new, old, "MODIFIED")

    def delete(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        key = (resource, namespace if RESOURCES[resource].namespaced else "", name)
        with self.changed:
            old = self._objects.pop(key, None)
            if old is None:
                raise not_found(resource, name, RESOURCES[resource].group)
            self._rv += 1
            final = copy.deepcopy(old)
            final["metadata"]["resourceVersion"] = str(self._rv)
            self._history.append(WatchEvent(self._rv, resource, "DELETED", final, old))
            self.changed.notify_all()
            return final

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def _put(
        self,
        key: tuple[str, str, str],
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        kind: str,
    ) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._history.append(WatchEvent(self._rv, key[0], kind, obj, old))
        self.changed.notify_all()
        return obj

    def all(self, resource: str) -> Iterable[dict[str, Any]]:
        return self.list(resource)[0]
