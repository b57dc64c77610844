"""`spot-pipelines demo --workload batch-inference|sweep`: the other two spot workloads.

Both run on the local spot cloud replaying a real trace, with at least one reclaim, and
end (with ``--json``) with one JSON object whose keys DESIGN.md fixes: the batch's
``items_total``, ``items_done``, ``duplicates``, ``preemptions``, ``outputs_sha256`` and
``uninterrupted_outputs_sha256``; the sweep's ``trials_total``, ``trials_complete``,
``preemptions``, ``best_value``, ``uninterrupted_best_value`` and ``storage``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spot_core.commands.text import event_line
from spot_core.demo import LOCAL_CLOUD
from spot_core.errors import ConfigError
from spot_core.model import JobRecord

TRAINING_STEPS = 2000  # `demo --steps`' default: the training demo's only


def run_workload(args: argparse.Namespace) -> int:
    """Run the batch or sweep demo; 0 when its result equals the uninterrupted run's."""
    if args.engine != "none" or args.provider != LOCAL_CLOUD:
        raise ConfigError(
            f"--workload {args.workload} runs on the local spot cloud without an engine; "
            "drop --engine and --provider (the engines' patterns are in dags/ and flows/)"
        )
    if args.start_tick is not None or args.steps != TRAINING_STEPS:
        raise ConfigError(
            f"--steps and --start-tick are the training demo's; drop them with --workload "
            f"{args.workload} (its size and trace stretch are fixed so it meets a reclaim)"
        )
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise ConfigError(f"--workdir {args.workdir} is not a folder; give a folder (or none)")
    started = time.monotonic()

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        attempt = record.attempts[-1] if record.attempts else None
        where = attempt.pool.key if attempt is not None else "-"
        heading = (
            f"  [{time.monotonic() - started:5.1f}s] {record.job_id.rsplit('-', 1)[-1]} "
            f"{kind:<12} {where}"
        )
        print(event_line(heading, detail), flush=True)

    run = _batch if args.workload == "batch-inference" else _sweep
    if args.workdir is not None:
        doc = run(args.workdir, listener)
    else:
        with tempfile.TemporaryDirectory(prefix="spot-demo-") as tmp:
            doc = run(Path(tmp), listener)
    if args.json:
        print(json.dumps(doc, allow_nan=False), flush=True)
    return 0 if _equal(doc) else 1


def _equal(doc: dict[str, Any]) -> bool:
    if doc["workload"] == "batch-inference":
        return bool(
            doc["outputs_sha256"] == doc["uninterrupted_outputs_sha256"]
            and doc["duplicates"] == 0
            and doc["items_done"] == doc["items_total"]
        )
    return bool(
        doc["best_value"] == doc["uninterrupted_best_value"]
        and doc["trials_complete"] == doc["trials_total"]
    )


Listen = Callable[[str, JobRecord, str], None]


def _batch(workdir: Path, listener: Listen) -> dict[str, Any]:
    from spot_core.demo.batch import BatchDemoConfig, run_batch_demo

    cfg = BatchDemoConfig()
    print(
        f"batch inference: {cfg.items} items in units of {cfg.unit_size}, {cfg.workers} "
        "workers on spot (local cloud replaying a real AWS V100 trace) sharing one queue",
        flush=True,
    )
    doc = run_batch_demo(workdir, cfg, listener).to_json()
    same = doc["outputs_sha256"] == doc["uninterrupted_outputs_sha256"]
    print(
        f"items {doc['items_done']}/{doc['items_total']}  duplicates {doc['duplicates']}  "
        f"preemptions {doc['preemptions']}  units reclaimed {doc['units_reclaimed']}\n"
        f"outputs        {doc['outputs_sha256']}\n"
        f"uninterrupted  {doc['uninterrupted_outputs_sha256']}  "
        f"{'(equal)' if same else '(DIFFERENT)'}",
        flush=True,
    )
    return doc


def _sweep(workdir: Path, listener: Listen) -> dict[str, Any]:
    from spot_core.demo.sweep import SweepDemoConfig, run_sweep_demo

    cfg = SweepDemoConfig()
    print(
        f"sweep: {cfg.trials} Optuna trials (TPE, seed {cfg.seed}), each a spot job on the "
        "local cloud replaying a real AWS V100 trace, the study in SQLite",
        flush=True,
    )
    doc = run_sweep_demo(workdir, cfg, listener).to_json()
    same = doc["best_value"] == doc["uninterrupted_best_value"]
    print(
        f"trials {doc['trials_complete']}/{doc['trials_total']}  preemptions "
        f"{doc['preemptions']}  storage {doc['storage']}\nbest value     {doc['best_value']}\n"
        f"uninterrupted  {doc['uninterrupted_best_value']}  "
        f"{'(equal)' if same else '(DIFFERENT)'}",
        flush=True,
    )
    return doc
