"""`spot-pipelines demo --engine airflow`: the example DAG run through real Airflow.

It makes a throw-away AIRFLOW_HOME (SQLite), migrates its database, starts the local
spot cloud as a server (so the worker that launches a lease and the trigger that
watches it talk to the same cloud), runs ``dags/spot_ml_pipeline.py`` with
``dag.test()`` (which also runs the deferred triggers), prints the training job's
record, and returns the DESIGN.md demo JSON.

With ``provider="kubernetes"`` (``make demo ENGINE=airflow PROVIDER=kubernetes``) the
same DAG trains through ``SpotKubernetesPodOperator`` on the Kubernetes emulator's spot
node pools, set up and reclaimed by flavour exactly as ``spot-pipelines demo --provider
kubernetes`` does (``spot_core.demo.kubernetes``); the cluster is the Airflow connection
``spot_kubernetes`` (its kubeconfig path in ``AIRFLOW_CONN_SPOT_KUBERNETES``).

Airflow is imported only after AIRFLOW_HOME is set, inside ``run_demo``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spot_core.checkpoint import open_store
from spot_core.demo import EMULATED_KUBERNETES, LOCAL_CLOUD
from spot_core.demo.kubernetes import Reclaimer
from spot_core.localcloud.server import client_environ

DAG_ID = "spot_ml_pipeline"
# An installed wheel carries dags/ as airflow_spot/example_dags (pyproject's force-include);
# a clone has it at its top.
_PACKAGED_DAGS = Path(__file__).resolve().parent / "example_dags"
DAGS_FOLDER = (
    _PACKAGED_DAGS if _PACKAGED_DAGS.is_dir() else Path(__file__).resolve().parent.parent / "dags"
)
# The local cloud replays 1 s as half a trace hour, and its replay starts when the
# training step first connects (however long Airflow took to get there), at tick 420 of
# the shipped excerpt: the ~60 s training run then loses us-east-2a (tick 524) and
# us-west-2b (tick 755): two preemptions, then the preemption budget sends the rest to
# on-demand.
TIME_SCALE = 1800.0
START_TICK = 420
# `make demo ENGINE=airflow` replays that stretch three times as fast with a third of the
# DAG's simulated compute per step (its default 0.03 s): each step still spans the same
# trace time, so training meets the same ticks at the same steps and is preempted the
# same two times, in a third of the wall time. Under dag.test() an attempt costs Airflow
# about a second (no scheduler, no executor, no trigger hold), which this speed allows;
# the scheduler-run DAG (standalone, a deployment) keeps the defaults above.
DEMO_SPEEDUP = 3
DEMO_TIME_SCALE = DEMO_SPEEDUP * TIME_SCALE
DEMO_STEP_SECONDS = 0.03 / DEMO_SPEEDUP
SERVER_START_TIMEOUT = 60.0
RESULT_KEYS = (
    "engine",
    "attempts",
    "preemptions",
    "fallbacks",
    "resumed_from_steps",
    "spot_cost",
    "on_demand_cost",
    "savings_fraction",
    "lost_work_seconds",
    "time_to_resume_seconds",
    "final_weights_sha256",
    "uninterrupted_weights_sha256",
    "accuracy",
)


def airflow_env(airflow_home: Path, dags_folder: Path = DAGS_FOLDER) -> dict[str, str]:
    """Environment for an isolated Airflow on SQLite that loads only our DAGs."""
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get(
            "AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING"
        ),
    }


def migrate() -> None:
    """Create the metadata database, in this process: ``airflow db migrate`` would load
    Airflow a second time in a process of its own (seconds of CPU, more on a busy
    machine), and the imports it needs are the ones ``dag.test()`` needs next. The
    environment (``airflow_env``) must be set before Airflow is first imported."""
    from airflow.utils.db import upgradedb

    upgradedb()


@contextmanager
def cloud_server(
    workdir: Path,
    *,
    time_scale: float = TIME_SCALE,
    start_tick: int = START_TICK,
    start_on_first_client: bool = False,
) -> Iterator[str]:
    """``python -m spot_core.localcloud.server`` as a child; yields its URL; stops it.

    Its token is in ``workdir`` (``client_environ(url, workdir)`` gives both)."""
    anchor = ["--start-on-first-client"] if start_on_first_client else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spot_core.localcloud.server",
            "--workdir",
            str(workdir),
            "--time-scale",
            str(time_scale),
            "--start-tick",
            str(start_tick),
            *anchor,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = _first_line(proc, SERVER_START_TIMEOUT)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    stdout = proc.stdout
    if stdout is None:  # never: the server is started with stdout=PIPE
        raise RuntimeError("the local cloud server's output is not a pipe")
    selector = selectors.DefaultSelector()
    selector.register(stdout, selectors.EVENT_READ)
    if not selector.select(timeout):
        raise RuntimeError(f"the local cloud server printed no URL within {timeout:.0f} s")
    url = stdout.readline().strip()
    if not url.startswith("http://"):
        raise RuntimeError(f"the local cloud server did not start (said {url!r})")
    return url


def run_pipeline(
    workdir: Path,
    steps: int,
    *,
    url: str | None = None,
    cloud_workdir: Path | None = None,
    step_seconds: float | None = None,
) -> dict[str, Any]:
    """Run the example DAG once under ``dag.test()``; return its report.json.

    The local cloud server at ``url`` (running in ``cloud_workdir``) is named to the tasks
    and the triggerer by environment: its URL and token (never in task arguments or logs);
    on Kubernetes the caller has set the connection's environment."""
    if url is not None:
        if cloud_workdir is None:  # its token lives there
            raise TypeError("run_pipeline(url=...) needs the server's cloud_workdir")
        os.environ.update(client_environ(url, cloud_workdir))
    os.environ["SPOT_PIPELINE_WORKDIR"] = str(workdir)
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    if bag.import_errors:
        raise RuntimeError(f"the example DAG does not import: {bag.import_errors}")
    conf = {"workdir": str(workdir), "steps": steps}
    if step_seconds is not None:
        conf["step_seconds"] = step_seconds
    run = bag.dags[DAG_ID].test(run_conf=conf)
    if run.state != "success":
        raise RuntimeError(f"the DAG run ended {run.state}; see the task logs above")
    reports = sorted((workdir / "runs").glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(reports[-1].read_text())


def run_demo(
    *, workdir: Path | None = None, steps: int = 2000, provider: str = LOCAL_CLOUD
) -> dict[str, Any]:
    if steps < 200:
        raise ValueError(
            f"steps must be at least 200 (got {steps}) so training lives long "
            "enough to be preempted"
        )
    run = _run_kubernetes if provider == EMULATED_KUBERNETES else _run
    quiet_engine_warnings()
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="spot-airflow-demo-") as tmp:
            return run(Path(tmp), steps)
    return run(Path(workdir).resolve(), steps)


# Warnings about the engine's own dependencies, not about the user's DAG or this project:
# dag.test() talks to Airflow's API through starlette's TestClient, which warns that it
# would rather have httpx2 (a note for Airflow's maintainers, printed to every demo user).
ENGINE_WARNINGS = (r"Using `httpx` with `starlette\.testclient` is deprecated",)


def quiet_engine_warnings() -> None:
    """Ignore ``ENGINE_WARNINGS`` in this process (the demo's; a deployment is untouched)."""
    for message in ENGINE_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def _run(workdir: Path, steps: int) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    env = airflow_env(workdir / "airflow_home")
    os.environ.update(env)
    os.environ["SPOT_PIPELINE_PROVIDER"] = LOCAL_CLOUD
    print(
        f"pipeline (Airflow {DAG_ID}): prepare -> train ({steps} steps, SpotJobOperator on "
        f"the local spot cloud replaying a real AWS V100 trace, 1 s = "
        f"{DEMO_TIME_SCALE / 3600:g} h) -> evaluate -> batch inference x3 shards -> report",
        flush=True,
    )
    started = time.monotonic()
    migrate()
    with cloud_server(
        workdir / "cloud", time_scale=DEMO_TIME_SCALE, start_on_first_client=True
    ) as url:
        report = run_pipeline(
            workdir, steps, url=url, cloud_workdir=workdir / "cloud", step_seconds=DEMO_STEP_SECONDS
        )
    _print(report, time.monotonic() - started, time_scale=DEMO_TIME_SCALE)
    result = report["result"]
    return {key: result[key] for key in RESULT_KEYS}


def _run_kubernetes(workdir: Path, steps: int) -> dict[str, Any]:
    """The DAG on the emulator's Karpenter, EKS spot and EKS on-demand node pools, the
    running spot node reclaimed by its flavour twice while the step trains."""
    from spot_core.demo.kubernetes import (
        KubernetesDemoConfig,
        cluster_watcher,
        emulated_cluster,
        require_emulator,
    )

    require_emulator()  # one line naming the extra, before Airflow's database is set up
    workdir.mkdir(parents=True, exist_ok=True)
    env = airflow_env(workdir / "airflow_home")
    os.environ.update(env)
    cfg = KubernetesDemoConfig(steps=steps)
    print(
        f"pipeline (Airflow {DAG_ID}): prepare -> train ({steps} steps, "
        "SpotKubernetesPodOperator on Kubernetes spot node pools: Karpenter, EKS managed, "
        "EKS on-demand; emulated cluster) -> evaluate -> batch inference x3 shards -> "
        "report",
        flush=True,
    )
    started = time.monotonic()
    migrate()
    with (
        emulated_cluster(workdir / "cluster", cfg) as cluster,
        cluster_watcher(cluster) as watcher,
    ):
        os.environ.update(kubernetes_env(cluster.kubeconfig_path))
        with _RunReclaimer(cluster, watcher, workdir, cfg):
            report = run_pipeline(workdir, steps)
    _print(report, time.monotonic() - started, time_scale=1.0)
    result = report["result"]
    return {key: result[key] for key in RESULT_KEYS}


def kubernetes_env(kubeconfig: Path) -> dict[str, str]:
    """The DAG's Kubernetes set-up: the ``spot_kubernetes`` connection (a kubeconfig
    path, never its contents) and the kubeconfig the inference shards' provider reads."""
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    return {
        "SPOT_PIPELINE_PROVIDER": EMULATED_KUBERNETES,
        "SPOT_PIPELINE_KUBECONFIG": str(kubeconfig),
        "AIRFLOW_CONN_SPOT_KUBERNETES": json.dumps(connection),
    }


class _RunReclaimer(Reclaimer):
    """``spot_core.demo.kubernetes.Reclaimer`` for a DAG run: the training store is the
    one the run writes under ``workdir/runs/<run id>``, known once the run has started."""

    def __init__(self, cluster, provider, workdir: Path, cfg) -> None:
        super().__init__(cluster, provider, None, (workdir / "runs").as_uri(), cfg)
        self.runs = workdir / "runs"

    def _spot_node_past(self, step: int):
        stores = sorted(self.runs.glob("*/checkpoints/train"), key=lambda p: p.stat().st_mtime)
        if not stores:
            return None
        self.store = open_store(stores[-1].as_uri())
        return super()._spot_node_past(step)


def _print(report: dict[str, Any], seconds: float, time_scale: float = TIME_SCALE) -> None:
    from spot_core.model import JobRecord
    from spot_core.report import print_record

    print_record(JobRecord.from_dict(report["train_record"]), time_scale)
    result = report["result"]
    same = result["final_weights_sha256"] == result["uninterrupted_weights_sha256"]
    print(
        f"final weights  {result['final_weights_sha256']}\n"
        f"uninterrupted  {result['uninterrupted_weights_sha256']}  "
        f"{'(equal)' if same else '(DIFFERENT)'}\naccuracy {result['accuracy']:.3f}; "
        f"batch inference: {result['inference_shards']} shards, "
        f"{result['inference_preemptions']} preemptions; the DAG ran in {seconds:.0f} s",
        flush=True,
    )
