"""`spot-pipelines demo`: the main job, end to end, with a report.

Until the trace-driven local spot cloud lands, this is the foundation walkthrough: a
training step on local capacity receives an AWS-shaped interruption notice from the
metadata emulator, saves an emergency checkpoint, stops, and a second attempt resumes
from it and finishes with weights identical to an uninterrupted run. Cost fields are
null here because no market prices this capacity yet; they are never invented.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from spot_core.errors import ConfigError


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the main job: a preempted training step "
                                   "that checkpoints, resumes and finishes")
    parser.add_argument("--engine", choices=["none", "airflow", "prefect"], default="none",
                        help="workflow engine to run the pipeline in (default: none)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where checkpoints and results go (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=300,
                        help="training steps (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.engine != "none":
        raise ConfigError(f"--engine {args.engine} needs the {args.engine} adapter, which is not "
                          "built yet; run `spot-pipelines demo --engine none`")
    if args.steps < 200:
        raise ConfigError("--steps must be at least 200 so the notice can arrive mid-run")
    from spot_core.sim.walkthrough import WalkthroughConfig, run_walkthrough

    cfg = WalkthroughConfig(steps=args.steps)
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="spot-demo-") as tmp:
            report = run_walkthrough(Path(tmp), cfg)
    else:
        report = run_walkthrough(args.workdir, cfg)
    _print_report(report)
    if args.json:
        print(json.dumps(demo_json(report)))
    return 0 if report.final and report.final["weights_sha256"] == report.uninterrupted_sha256 else 1


def demo_json(report) -> dict:
    """The stable JSON contract of `spot-pipelines demo --json`."""
    summary = report.record.summary()
    return {
        "engine": "none",
        "attempts": summary["attempts"],
        "preemptions": summary["preemptions"],
        "fallbacks": summary["fallbacks"],
        "resumed_from_steps": summary["resumed_from_steps"],
        "spot_cost": None,
        "on_demand_cost": None,
        "savings_fraction": None,
        "lost_work_seconds": summary["lost_work_seconds"],
        "final_weights_sha256": report.final["weights_sha256"] if report.final else None,
        "uninterrupted_weights_sha256": report.uninterrupted_sha256,
        "accuracy": report.final["accuracy"] if report.final else None,
    }


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, highlight=False)
    table = Table(title=f"job {report.record.job_id}")
    for column in ("attempt", "pool", "outcome", "resumed from step", "last checkpoint step",
                   "lost work (s)", "seconds"):
        table.add_column(column)
    for a in report.record.attempts:
        table.add_row(str(a.number), a.pool.key, str(a.outcome), _dash(a.checkpoint_step_start),
                      _dash(a.checkpoint_step_end), f"{a.lost_work_seconds:.2f}",
                      f"{(a.ended_at or a.started_at) - a.started_at:.1f}")
    console.print(table)
    for notice in report.notices:
        console.print(f"notice: {json.dumps(notice)}")
    same = report.final and report.final["weights_sha256"] == report.uninterrupted_sha256
    console.print(f"final weights equal the uninterrupted run's: {'yes' if same else 'NO'}; "
                  f"accuracy {report.final['accuracy'] if report.final else float('nan'):.3f}")


def _dash(value) -> str:
    return "-" if value is None else str(value)
