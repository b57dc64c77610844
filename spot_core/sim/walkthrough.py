"""The foundation walkthrough: a training step is interrupted, checkpoints, and resumes.

Every part is real: the step is a subprocess running the NumPy training workload under
`spot-pipelines watch`; the interruption notice comes over HTTP from the metadata
emulator in the AWS IMDSv2 shape; the emergency checkpoint goes through the file
checkpoint store; the resumed attempt restores from it. The result is compared with an
uninterrupted run of the same job. The trace-driven local spot cloud (with prices, pools
and on-demand fallback) builds on this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from spot_core.attempt_env import AttemptEnv
from spot_core.checkpoint import open_store
from spot_core.errors import InfrastructureError
from spot_core.model import Attempt, JobRecord, Outcome, Pool
from spot_core.sim.metadata_emulator import MetadataEmulator
from spot_core.workloads.softmax_regression import TrainConfig, train

LOCAL_POOL = Pool(cloud="local", region="local", zone="local-a", instance_type="cpu-2")


@dataclass(frozen=True)
class WalkthroughConfig:
    steps: int = 300
    step_seconds: float = 0.01
    checkpoint_every_steps: int = 50
    notice_after_step: int = 120
    notice_seconds: float = 2.0
    poll_interval: float = 0.2
    attempt_timeout: float = 120.0


@dataclass
class WalkthroughReport:
    record: JobRecord
    notices: list[dict] = field(default_factory=list)
    final: dict | None = None
    uninterrupted_sha256: str = ""
    uninterrupted_accuracy: float = 0.0


def _step_command(cfg: WalkthroughConfig, endpoint: str, result: Path) -> list[str]:
    watch = [sys.executable, "-m", "spot_core.cli", "watch", "--cloud", "aws",
             "--endpoint", endpoint, "--poll-interval", str(cfg.poll_interval)]
    step = [sys.executable, "-m", "spot_core.workloads.softmax_regression",
            "--steps", str(cfg.steps), "--step-seconds", str(cfg.step_seconds),
            "--checkpoint-every-steps", str(cfg.checkpoint_every_steps), "--result", str(result)]
    return [*watch, "--", *step]


def _wait_for_step(store, step: int, proc: subprocess.Popen, timeout: float) -> None:
    """Block until the store holds a checkpoint at or past ``step`` (bounded)."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up and proc.poll() is None:
        ref = store.latest()
        if ref is not None and ref.step >= step:
            return
        time.sleep(0.05)
    raise InfrastructureError(f"the step never reached checkpoint step {step} within {timeout:.0f} s")


def _run_attempt(cfg, workdir: Path, record: JobRecord, emulator, interrupt: bool):
    """Run one attempt to its end; return the finished Attempt, watch events and result."""
    store_uri = record.checkpoint_uri
    number = record.current_attempt.number
    store = open_store(store_uri)
    start_ref = store.latest()
    result_path = workdir / f"result-attempt-{number}.json"
    env = {**os.environ, **AttemptEnv(checkpoint_uri=store_uri, job_id=record.job_id,
                                       attempt=number, metadata_endpoint=emulator.url,
                                       cloud="aws", notice_file=None).to_environ()}
    started = time.time()
    proc = subprocess.Popen(_step_command(cfg, emulator.url, result_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if interrupt:
            _wait_for_step(store, cfg.notice_after_step, proc, cfg.attempt_timeout)
            emulator.schedule_interruption(notice_seconds=cfg.notice_seconds)
        stdout, stderr = proc.communicate(timeout=cfg.attempt_timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    ended = time.time()
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"event"')]
    end_ref = store.latest()
    outcome = _classify(proc.returncode, events)
    if outcome is Outcome.INFRASTRUCTURE_FAILED:
        raise InfrastructureError(f"attempt {number} failed (exit {proc.returncode}): "
                                  f"{stderr.strip().splitlines()[-1:] or 'no output'}")
    lost = 0.0 if outcome is Outcome.SUCCEEDED or end_ref is None else max(
        0.0, ended - end_ref.created_at)
    attempt = Attempt(number=number, pool=LOCAL_POOL, started_at=started, ended_at=ended,
                      outcome=outcome,
                      checkpoint_step_start=None if start_ref is None else start_ref.step,
                      checkpoint_step_end=None if end_ref is None else end_ref.step,
                      lost_work_seconds=lost)
    final = json.loads(result_path.read_text()) if outcome is Outcome.SUCCEEDED else None
    return attempt, end_ref, events, final


def _classify(returncode: int, events: list[dict]) -> Outcome:
    if any(e.get("event") == "interruption" for e in events):
        return Outcome.PREEMPTED
    return Outcome.SUCCEEDED if returncode == 0 else Outcome.INFRASTRUCTURE_FAILED


def run_walkthrough(workdir: Path, cfg: WalkthroughConfig = WalkthroughConfig()) -> WalkthroughReport:
    """Run the job uninterrupted once, then interrupted-and-resumed; return both results."""
    workdir.mkdir(parents=True, exist_ok=True)
    reference = train(TrainConfig(steps=cfg.steps))
    store_uri = (workdir / f"checkpoints-{uuid.uuid4().hex[:8]}").resolve().as_uri()
    record = JobRecord(job_id=f"demo-{uuid.uuid4().hex[:8]}", created_at=time.time(),
                       checkpoint_uri=store_uri)
    report = WalkthroughReport(record=record, uninterrupted_sha256=reference.weights_sha256,
                               uninterrupted_accuracy=reference.accuracy)
    with MetadataEmulator() as emulator:
        for interrupt in (True, False):
            emulator.clear()
            record = record.start_attempt(Attempt(record.next_attempt_number, LOCAL_POOL, time.time()))
            attempt, end_ref, events, final = _run_attempt(cfg, workdir, record, emulator, interrupt)
            record = record.finish_attempt(attempt)
            if end_ref is not None:
                record = record.with_checkpoint(end_ref)
            report.notices.extend(events)
            report.final = final or report.final
    report.record = record
    return report
