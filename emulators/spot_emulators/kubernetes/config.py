"""What an emulated cluster is made of: node pools, timings and which images exist.

Read from ``cluster.json`` for the command-line emulator or built in Python by tests:

    {"pools": [{"name": "gke-spot", "flavour": "gke", "zone": "us-central1-a",
                "nodes": 2, "pods": 4, "replace_after_seconds": null}],
     "time_scale": 0.1,
     "timings": {"gke_shutdown_grace_seconds": 30},
     "images": {"unknown": ["registry.example/private:1"]}}

Every duration the emulator waits (grace periods, graceful node shutdown, pod GC,
node replacement, image pulls, back-offs) is multiplied by ``time_scale``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .pools import NodePool, default_pools


@dataclass
class Timings:
    image_pull_seconds: float = 0.1
    gke_shutdown_grace_seconds: float = 30.0  # kubelet shutdownGracePeriod on GKE spot
    gke_shutdown_critical_seconds: float = 15.0  # ...of which kept for critical pods
    vm_shutdown_seconds: float = 5.0  # OS shutdown of a lost machine: TERM -> KILL
    pod_gc_seconds: float = 0.0  # orphaned pods quarantine before pod GC
    drain_step_seconds: float = 0.0  # pause between evictions in a drain
    node_gone_seconds: float = 2.0  # drained/shut-down node to Node deleted
    max_drain_seconds: float = 600.0  # bound on waiting for a drain
    event_ttl_seconds: float = 3600.0  # the API server's --event-ttl

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Timings:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown timings {sorted(unknown)}: use {sorted(known)}")
        return cls(**{k: float(v) for k, v in raw.items()})


@dataclass
class ImagePolicy:
    """Which images "exist": ``known`` (None = any) minus ``unknown``; a name containing
    ``doesnotexist`` never exists."""

    known: set[str] | None = None
    unknown: set[str] = field(default_factory=set)

    def error(self, image: str, normalized: str) -> str | None:
        missing = (
            "doesnotexist" in image
            or image in self.unknown
            or (self.known is not None and image not in self.known)
        )
        if not missing:
            return None
        return (
            f"rpc error: code = NotFound desc = failed to pull and unpack image "
            f'"{normalized}": failed to resolve reference "{normalized}": '
            f"{normalized}: not found"
        )


@dataclass
class ClusterConfig:
    pools: list[NodePool] = field(default_factory=default_pools)
    time_scale: float = 1.0
    timings: Timings = field(default_factory=Timings)
    images: ImagePolicy = field(default_factory=ImagePolicy)

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        names = [p.name for p in self.pools]
        if len(names) != len(set(names)):
            raise ValueError(f"node pool names must be unique, got {names}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClusterConfig:
        unknown = set(raw) - {"pools", "time_scale", "timings", "images"}
        if unknown:
            raise ValueError(
                f"unknown cluster keys {sorted(unknown)}: use pools, time_scale, timings, images"
            )
        images = raw.get("images") or {}
        known = images.get("known")
        return cls(
            pools=[NodePool.from_dict(p) for p in raw["pools"]]
            if "pools" in raw
            else default_pools(),
            time_scale=float(raw.get("time_scale", 1.0)),
            timings=Timings.from_dict(raw.get("timings") or {}),
            images=ImagePolicy(
                set(known) if known is not None else None, set(images.get("unknown") or ())
            ),
        )

    @classmethod
    def load(cls, path: str | Path) -> ClusterConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cluster file {path}: {exc}") from None
        return cls.from_dict(raw)
