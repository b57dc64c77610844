"""Builders for the arrange blocks the controller tests repeat: a local spot cloud on
traces, a job, a controller, a run in a thread. Each fills in what every such test sets the
same way (the cloud's folder, the store's folder, the poll interval) and takes the rest,
so a test shows only what it is about: its traces, its command, its policy.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from spot_core.controller import Controller, JobSpec
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.market.trace import ZoneTrace
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.local import LocalProvider

# A notice a second ahead and a second's grace: the shortest a step still saves in.
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)


def local_cloud(
    tmp_path: Path,
    traces: list[ZoneTrace],
    *,
    time_scale: float = 60.0,
    config: LocalCloudConfig = FAST,
    **options: Any,
) -> LocalProvider:
    """The local spot cloud on ``traces``, its state in ``tmp_path / "cloud"``."""
    return LocalProvider.from_traces(
        traces, time_scale=time_scale, workdir=tmp_path / "cloud", config=config, **options
    )


def store_uri(tmp_path: Path) -> str:
    """The job's checkpoint store: ``tmp_path / "ckpt"``."""
    return (tmp_path / "ckpt").as_uri()


def job_spec(
    tmp_path: Path,
    provider: Any,
    command: tuple[str, ...],
    *,
    job_id: str = "job-test",
    **fields: Any,
) -> JobSpec:
    """A job on every pool of ``provider``, checkpointing to ``store_uri(tmp_path)``;
    ``fields`` are the rest of JobSpec's (a deadline, the pools, ...)."""
    fields.setdefault("checkpoint_uri", store_uri(tmp_path))
    fields.setdefault("pools", provider.pools())
    return JobSpec(job_id=job_id, command=command, **fields)


def controller_for(
    provider: Any,
    policy: RetryPolicy | None = None,
    *,
    market: Any = None,
    poll_interval_seconds: float = 0.05,
    **options: Any,
) -> Controller:
    """A controller on ``provider`` and its own market (or ``market``, a view of its own)."""
    return Controller(
        provider,
        market or provider.market,
        RetryPolicy() if policy is None else policy,
        poll_interval_seconds=poll_interval_seconds,
        **options,
    )


def run_in_thread(controller: Controller, spec: JobSpec) -> tuple[threading.Thread, dict]:
    """``controller.run(spec)`` in a daemon thread, so the test can act on the cloud while
    it runs; the dict gets ``record`` or the ``error`` it raised."""
    result: dict = {}

    def target() -> None:
        try:
            result["record"] = controller.run(spec)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def finished_record(thread: threading.Thread, result: dict, timeout_seconds: float) -> Any:
    """The JobRecord of a ``run_in_thread`` run, once it ended within ``timeout_seconds``
    without raising."""
    thread.join(timeout_seconds)
    assert not thread.is_alive() and "error" not in result, result.get("error")
    return result["record"]
