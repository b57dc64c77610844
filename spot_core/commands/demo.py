"""`spot-pipelines demo`: the main job, an ML pipeline surviving real-trace preemptions.

prepare data -> train on the trace-driven local spot cloud -> evaluate, then a report:
attempts, preemptions, resumed-from steps, spot cost, on-demand equivalent, savings,
lost work, and the final weights' SHA-256 next to an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spot_core.commands.text import event_line
from spot_core.demo import DEMO_PROVIDERS, EMULATED_KUBERNETES, LOCAL_CLOUD
from spot_core.errors import ConfigError
from spot_core.safe_files import check_target, write_bytes

if TYPE_CHECKING:
    from spot_core.demo.pipeline import DemoConfig, DemoReport
    from spot_core.model import JobRecord

ENGINES = ("none", "airflow", "prefect")
RECORD_FILE = "record.json"  # the training job's JobRecord, in --workdir
WORKLOADS = ("training", "batch-inference", "sweep")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the main job: an ML pipeline whose training "
        "step is preempted, resumes from checkpoints and finishes",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="none",
        help="workflow engine to run the pipeline in (default: none)",
    )
    parser.add_argument(
        "--provider",
        choices=DEMO_PROVIDERS,
        default=LOCAL_CLOUD,
        help="where the training step runs: the local spot cloud replaying a "
        "real trace, or spot node pools of the Kubernetes emulator (default: "
        "local)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where data, checkpoints and lease logs go (default: a temp folder)",
    )
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    parser.add_argument(
        "--start-tick",
        type=int,
        default=None,
        help="trace tick the pipeline starts at (default: the demo's)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="training",
        help="what the demo runs: the training pipeline (default), a batch inference "
        "queue, or an Optuna sweep (docs/batch.md, docs/sweeps.md)",
    )
    parser.set_defaults(handler=run)


MAX_DEMO_STEPS = 1_000_000


def run(args: argparse.Namespace) -> int:
    """The demo, stopped cleanly by SIGINT, SIGTERM or SIGHUP (as ``run`` is): its leases
    are terminated and its clouds closed, rather than its steps left to the heartbeat.
    An engine's demo keeps the engine's own signal handling."""
    from spot_core.stopping import stop_on_signals

    if args.engine != "none":
        return _run_demo(args)
    with stop_on_signals():
        return _run_demo(args)


def _run_demo(args: argparse.Namespace) -> int:
    from spot_core.demo.pipeline import DemoConfig

    if args.workload != "training":
        from spot_core.commands.demo_workloads import run_workload

        return run_workload(args)
    _check_workdir(args.workdir)
    if args.steps > MAX_DEMO_STEPS:  # every engine's: 10^20 steps would train for ever
        raise ConfigError(
            f"--steps must be at most {MAX_DEMO_STEPS:,} (got {args.steps}); the "
            "demo's default is 2000"
        )
    if args.provider == EMULATED_KUBERNETES and args.engine == "none":
        return _run_kubernetes_demo(args)
    if args.engine != "none":
        return _run_engine_demo(args)
    if args.steps < 200:
        raise ConfigError(
            f"--steps must be at least 200 (got {args.steps}) so the training step "
            "lives long enough to be preempted"
        )
    defaults = DemoConfig()
    cfg = DemoConfig(
        steps=args.steps,
        start_tick=defaults.start_tick if args.start_tick is None else _start_tick(args.start_tick),
    )
    # A live display only for a person at a terminal; piped and --json output stay the
    # plain lines (the JSON contract in DESIGN.md is the last line either way).
    live = sys.stdout.isatty() and not args.json
    run_in = _run_live if live else _run
    if args.workdir is not None:
        report = run_in(args.workdir, cfg)
    else:
        with tempfile.TemporaryDirectory(prefix="spot-demo-") as tmp:
            report = run_in(Path(tmp), cfg)
    _print_report(report)
    if live and args.workdir is not None:
        print(
            f"record {args.workdir / RECORD_FILE}  (spot-pipelines report it --html report.html)",
            flush=True,
        )
    if args.json:
        print(json.dumps(demo_json(report), allow_nan=False), flush=True)
    return 0 if report.final_weights_sha256 == report.uninterrupted_weights_sha256 else 1


def _run_kubernetes_demo(args: argparse.Namespace) -> int:
    """The same pipeline with its training step as pods on the emulator's spot node pools."""
    from spot_core.demo.kubernetes import KubernetesDemoConfig, require_emulator, run_demo

    require_emulator()  # a separate distribution: one line naming its extra
    if args.start_tick is not None:
        raise ConfigError(
            "--start-tick picks a trace tick of the local cloud; drop it with "
            "--provider kubernetes (its nodes are reclaimed by flavour scripts)"
        )
    if args.steps < 200:
        raise ConfigError(
            f"--steps must be at least 200 (got {args.steps}) so the training step "
            "lives long enough to be preempted"
        )
    cfg = KubernetesDemoConfig(steps=args.steps)
    print(
        f"pipeline: prepare data -> train ({cfg.steps} steps as pods on Kubernetes spot node "
        "pools: Karpenter, EKS managed, EKS on-demand; emulated cluster) -> evaluate",
        flush=True,
    )
    started = time.monotonic()

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        print(_event_line(time.monotonic() - started, kind, record, detail), flush=True)

    if args.workdir is not None:
        report = _kept(args.workdir, run_demo(args.workdir, cfg, listener))
    else:
        with tempfile.TemporaryDirectory(prefix="spot-demo-k8s-") as tmp:
            report = run_demo(Path(tmp), cfg, listener)
    _print_report(report)
    if args.json:
        print(json.dumps(demo_json(report), allow_nan=False), flush=True)
    return 0 if report.final_weights_sha256 == report.uninterrupted_weights_sha256 else 1


def _start_tick(tick: int) -> int:
    """Checked before anything runs: the demo replays the shipped traces from this tick."""
    from spot_core.market.fixtures import default_traces

    ticks = min(t.n_ticks for t in default_traces())
    if not 0 <= tick < ticks:
        raise ConfigError(
            f"--start-tick {tick} is outside the demo's traces ({ticks} ticks); "
            f"give a tick from 0 to {ticks - 1}, or drop it for the default"
        )
    return tick


def _run_engine_demo(args: argparse.Namespace) -> int:
    """Hand over to the engine adapter's demo, found through the ``spot_pipelines.demos``
    entry point so that spot_core never imports an engine."""
    from importlib.metadata import entry_points
    from importlib.util import find_spec

    found = [ep for ep in entry_points(group="spot_pipelines.demos") if ep.name == args.engine]
    try:
        if find_spec(args.engine) is None:  # the engine itself, not just our adapter
            raise ImportError(f"no module named {args.engine!r}")
        run_demo = found[0].load()
    except (IndexError, ImportError) as exc:
        raise ConfigError(
            f"--engine {args.engine} needs {args.engine} and its adapter in this "
            f"environment: run `make demo ENGINE={args.engine}` (or install "
            f"spot-pipelines[{args.engine}])"
        ) from exc
    if args.provider != LOCAL_CLOUD:
        if args.engine != "airflow":
            raise ConfigError(
                f"--engine {args.engine} runs on the local spot cloud only; drop "
                f"--provider {args.provider} (or use --engine airflow or none)"
            )
        if args.start_tick is not None:
            raise ConfigError(
                "--start-tick picks a trace tick of the local cloud; drop it "
                f"with --provider {args.provider}"
            )
    extra = {} if args.provider == LOCAL_CLOUD else {"provider": args.provider}
    report = run_demo(workdir=args.workdir, steps=args.steps, **extra)
    # The process ends after this report: spare it the final garbage collection over the
    # engine's heap (Airflow's took 4 s at exit on a loaded 2-core machine, 0.25 s frozen).
    gc.freeze()
    if args.json:
        print(json.dumps(report, allow_nan=False), flush=True)
    return 0 if report["final_weights_sha256"] == report["uninterrupted_weights_sha256"] else 1


def _run(workdir: Path, cfg: DemoConfig) -> DemoReport:
    from spot_core.demo.pipeline import run_demo

    print(_header(cfg), flush=True)
    started = time.monotonic()

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        print(_event_line(time.monotonic() - started, kind, record, detail), flush=True)

    return _kept(workdir, run_demo(workdir, cfg, listener))


def _run_live(workdir: Path, cfg: DemoConfig) -> DemoReport:
    """The same run under a rich live panel: events scroll above it, the panel shows the
    running attempt, checkpointed progress and the saving so far."""
    from rich.console import Console
    from rich.live import Live

    from spot_core.demo.pipeline import run_demo
    from spot_core.report import LiveProgress

    console = Console(highlight=False)
    console.print(_header(cfg), markup=False)
    progress = LiveProgress(cfg.steps, title="demo training step")
    started = time.monotonic()
    with Live(progress, console=console, refresh_per_second=4, transient=True) as live:

        def listener(kind: str, record: JobRecord, detail: str) -> None:
            progress.listener(kind, record, detail)
            live.console.print(
                _event_line(time.monotonic() - started, kind, record, detail), markup=False
            )

        report = run_demo(workdir, cfg, listener)
    return _kept(workdir, report)


def _kept(workdir: Path, report: DemoReport) -> DemoReport:
    """The job's record beside its checkpoints, for `spot-pipelines report`."""
    write_bytes(workdir / RECORD_FILE, report.record.to_json() + "\n", what="demo record")
    return report


def _check_workdir(workdir: Path | None) -> None:
    """Before the pipeline runs: the record it ends with must be writable there (a folder,
    a FIFO or a link at WORKDIR/record.json is one line now, not after minutes of work)."""
    if workdir is not None and workdir.is_dir():
        check_target(workdir / RECORD_FILE, what="demo record")


def _header(cfg: DemoConfig) -> str:
    return (
        f"pipeline: prepare data -> train ({cfg.steps} steps on spot, local cloud replaying "
        f"a real AWS V100 trace at 1 s = {cfg.time_scale / 3600:g} h) -> evaluate"
    )


def _event_line(elapsed: float, kind: str, record: JobRecord, detail: str) -> str:
    attempt = record.attempts[-1] if record.attempts else None
    where = attempt.pool.key if attempt is not None else "-"
    number = attempt.number if attempt is not None else 0
    return event_line(f"  [{elapsed:5.1f}s] attempt {number} {kind:<20} {where}", detail)


def demo_json(report: DemoReport) -> dict[str, Any]:
    """The stable JSON contract of `spot-pipelines demo --json` (DESIGN.md)."""
    from spot_core.report import demo_report

    return demo_report(
        "none",
        report.record,
        final_weights_sha256=report.final_weights_sha256,
        uninterrupted_weights_sha256=report.uninterrupted_weights_sha256,
        accuracy=report.accuracy,
    )


def _print_report(report: DemoReport) -> None:
    from spot_core.report import print_record

    print_record(report.record, report.time_scale)
    same = report.final_weights_sha256 == report.uninterrupted_weights_sha256
    print(
        f"final weights  {report.final_weights_sha256}\n"
        f"uninterrupted  {report.uninterrupted_weights_sha256}  "
        f"{'(equal)' if same else '(DIFFERENT)'}\naccuracy {report.accuracy:.3f}",
        flush=True,
    )
