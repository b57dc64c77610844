"""The main job: an ML pipeline whose training step runs on the trace-driven local spot cloud.

prepare data -> train (a spot job under the controller) -> evaluate. The training step is
a real subprocess per attempt; the local cloud replays a real AWS V100 availability trace,
so capacity is taken away as it was in us-east-2 and us-west-2, with notices from the
metadata emulator. The step saves an emergency checkpoint on each notice, the controller
resumes it on another pool or on on-demand once the preemption budget is spent, and the
final weights are compared with an uninterrupted run of the same training.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spot_core.checkpoint import open_store
from spot_core.controller import Controller, JobSpec, Listener
from spot_core.model import JobRecord
from spot_core.policy.checkpoint_interval import checkpoint_interval
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.local import LocalProvider
from spot_core.workloads.example_pipeline import train_command
from spot_core.workloads.softmax_regression import (
    TrainConfig,
    evaluate,
    prepare_dataset,
    train,
)

REFERENCE_TIMEOUT = 300.0  # seconds the report waits for the uninterrupted run


@dataclass(frozen=True)
class DemoConfig:
    steps: int = 2000
    step_seconds: float = 0.01  # simulated compute per step: about 20 s of training
    time_scale: float = 3600.0  # one trace hour per wall second
    # Where in the shipped trace excerpt the pipeline starts: a day into it (so the
    # look-back statistics have history), shortly before us-east-2a loses capacity and
    # about 16 trace hours before us-west-2b does.
    start_tick: int = 450
    max_preemptions: int = 2  # then the rest runs on on-demand
    checkpoint_cost_seconds: float = 60.0  # capacity seconds a save is expected to take


@dataclass(frozen=True)
class DemoReport:
    record: JobRecord
    final_weights_sha256: str
    uninterrupted_weights_sha256: str
    accuracy: float
    checkpoint_every_seconds: float
    time_scale: float


@dataclass(frozen=True)
class DemoData:
    """What every demo's training job starts from and is judged against: the data set,
    the weights an uninterrupted run ends with, and the job's checkpoint store.

    The uninterrupted run trains in a thread beside the spot job (a second of CPU that
    would otherwise delay the first launch); the report waits for it."""

    data: Path
    store_uri: str
    reference: Future[str]  # the uninterrupted run's weights' SHA-256

    @classmethod
    def prepare(cls, workdir: Path, steps: int) -> DemoData:
        workdir.mkdir(parents=True, exist_ok=True)
        data = prepare_dataset(TrainConfig(), workdir / "data" / "dataset.npz")
        pool = ThreadPoolExecutor(1, thread_name_prefix="demo-reference")
        reference = pool.submit(lambda: train(TrainConfig(steps=steps), data=data).weights_sha256)
        pool.shutdown(wait=False)
        return cls(data, (workdir / "checkpoints").resolve().as_uri(), reference)

    @property
    def uninterrupted_weights_sha256(self) -> str:
        return self.reference.result(timeout=REFERENCE_TIMEOUT)

    def report(
        self, record: JobRecord, checkpoint_every_seconds: float, time_scale: float
    ) -> DemoReport:
        """Evaluate the final checkpoint (the pipeline's last step) beside the reference."""
        sha, accuracy = evaluate(open_store(self.store_uri), self.data)
        return DemoReport(
            record,
            sha,
            self.uninterrupted_weights_sha256,
            accuracy,
            checkpoint_every_seconds,
            time_scale,
        )


def demo_policy(max_preemptions: int) -> RetryPolicy:
    """The demos' retry policy: spot until ``max_preemptions``, then on-demand for good."""
    return RetryPolicy(
        max_preemptions=max_preemptions,
        capacity_wait_seconds=0.5,
        max_capacity_waits=20,
        min_on_demand_seconds=1e9,
    )


def run_demo(
    workdir: Path, cfg: DemoConfig = DemoConfig(), listener: Listener | None = None
) -> DemoReport:
    demo = DemoData.prepare(workdir, cfg.steps)
    with LocalProvider.from_traces(
        time_scale=cfg.time_scale, start_tick=cfg.start_tick, workdir=workdir / "cloud"
    ) as provider:
        every = _checkpoint_every(provider, cfg)
        spec = JobSpec(
            job_id=f"demo-train-{uuid.uuid4().hex[:6]}",
            command=tuple(
                train_command(str(demo.data), cfg.steps, cfg.step_seconds, f"{every:.4f}")
            ),
            checkpoint_uri=demo.store_uri,
            pools=provider.pools(),
        )
        controller = Controller(
            provider,
            provider.market,
            demo_policy(cfg.max_preemptions),
            listener=listener,
            poll_interval_seconds=0.1,
        )  # a trace hour passes each wall second
        record = controller.run(spec)
    return demo.report(record, every, cfg.time_scale)


def _checkpoint_every(provider: LocalProvider, cfg: DemoConfig) -> float:
    """Young/Daly from the pools' observed interruption rate, in wall seconds."""
    now = provider.cloud.clock()
    stats = provider.market.stats(provider.pools(), now).values()
    rate = max((s.interruptions_per_hour for s in stats), default=0.0)
    capacity_interval = checkpoint_interval(
        cfg.checkpoint_cost_seconds, rate, min_seconds=300, max_seconds=3600
    )
    return capacity_interval / cfg.time_scale
