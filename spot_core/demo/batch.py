"""The batch inference demo: workers on the trace-driven local spot cloud share one queue.

A batch of items is cut into units in a work queue (``spot_core.workloads.batch``); a few
workers, each a spot job under the controller on the local cloud replaying a real AWS
V100 trace, take units until none is left. Reclaims take workers away mid-unit: a notice
releases the unit with its progress checkpointed, a vanished lease's claim lapses and is
taken over, and the controller relaunches the worker on another pool or on on-demand.
The result is compared with a plain loop over the same items.
"""

from __future__ import annotations

import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spot_core.controller import Controller, JobSpec, Listener
from spot_core.demo.pipeline import demo_policy
from spot_core.model import JobRecord
from spot_core.providers.local import LocalProvider
from spot_core.workloads.batch import ItemRange, WorkQueue, outputs_sha256
from spot_core.workloads.batch_inference import ITEM_SECONDS, infer


@dataclass(frozen=True)
class BatchDemoConfig:
    items: int = 600
    unit_size: int = 20
    workers: int = 3
    item_seconds: float = 0.05  # simulated forward pass: about 10 s of work per worker
    checkpoint_every_items: int = 5
    claim_timeout_seconds: float = 3.0
    time_scale: float = 3600.0  # one trace hour per wall second
    start_tick: int = 450  # shortly before us-east-2a loses capacity (the training demo's)
    max_preemptions: int = 2


@dataclass(frozen=True)
class BatchDemoReport:
    records: tuple[JobRecord, ...]
    items_total: int
    items_done: int
    duplicates: int
    units_reclaimed: int
    outputs_sha256: str
    uninterrupted_outputs_sha256: str

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.records)

    def to_json(self) -> dict[str, object]:
        """The stable JSON of `spot-pipelines demo --workload batch-inference --json`."""
        spent = sum(r.summary()["spot_cost"] for r in self.records)
        on_demand = sum(r.summary()["on_demand_cost"] for r in self.records)
        return {
            "workload": "batch-inference",
            "items_total": self.items_total,
            "items_done": self.items_done,
            "duplicates": self.duplicates,
            "preemptions": self.preemptions,
            "workers": len(self.records),
            "attempts": sum(len(r.attempts) for r in self.records),
            "units_reclaimed": self.units_reclaimed,
            "spot_cost": spent,
            "on_demand_cost": on_demand,
            "outputs_sha256": self.outputs_sha256,
            "uninterrupted_outputs_sha256": self.uninterrupted_outputs_sha256,
        }


def run_batch_demo(
    workdir: Path, cfg: BatchDemoConfig = BatchDemoConfig(), listener: Listener | None = None
) -> BatchDemoReport:
    workdir.mkdir(parents=True, exist_ok=True)
    queue = WorkQueue.create(
        (workdir / "queue").resolve().as_uri(),
        ItemRange(0, cfg.items),
        unit_size=cfg.unit_size,
        claim_timeout_seconds=cfg.claim_timeout_seconds,
    )
    run_id = uuid.uuid4().hex[:6]
    with LocalProvider.from_traces(
        time_scale=cfg.time_scale, start_tick=cfg.start_tick, workdir=workdir / "cloud"
    ) as provider:
        controller = Controller(
            provider,
            provider.market,
            demo_policy(cfg.max_preemptions),
            listener=listener,
            poll_interval_seconds=0.1,
        )
        specs = [
            JobSpec(
                job_id=f"demo-batch-{run_id}-w{i}",
                command=_worker_command(queue.uri, cfg),
                checkpoint_uri=(workdir / "workers" / f"w{i}").resolve().as_uri(),
                pools=provider.pools(),
                env={ITEM_SECONDS: f"{cfg.item_seconds:g}"},
            )
            for i in range(cfg.workers)
        ]
        with ThreadPoolExecutor(cfg.workers, thread_name_prefix="batch-worker") as pool:
            records = tuple(pool.map(controller.run, specs))
    return _report(queue, records)


def _report(queue: WorkQueue, records: tuple[JobRecord, ...]) -> BatchDemoReport:
    outputs = list(queue.outputs())
    items = [o["item"] for _, values in outputs for o in values]
    spec = queue.spec
    plain = [(u, [infer(i) for i in spec.unit_items(u)]) for u in spec.unit_ids()]
    return BatchDemoReport(
        records,
        items_total=len(spec.items),
        items_done=len(set(items)),
        duplicates=len(items) - len(set(items)),
        units_reclaimed=queue.progress().reclaims,
        outputs_sha256=outputs_sha256(outputs),
        uninterrupted_outputs_sha256=outputs_sha256(plain),
    )


def _worker_command(queue_uri: str, cfg: BatchDemoConfig) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "spot_core.workloads.batch_worker",
        "--queue",
        queue_uri,
        "--function",
        "spot_core.workloads.batch_inference:infer",
        "--checkpoint-every-items",
        str(cfg.checkpoint_every_items),
    )
