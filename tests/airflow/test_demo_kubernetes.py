"""The example DAG on Kubernetes: ``make demo ENGINE=airflow PROVIDER=kubernetes``.

The quick test parses the DAG in its Kubernetes form; the slow one runs the whole demo
(about 3 minutes: the emulator's spot node pools reclaimed by two flavours while the
training pod runs under SpotKubernetesPodOperator) and checks the DESIGN.md contract.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_dag_trains_through_the_pod_operator_on_kubernetes(airflow_home, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_spot.demo import kubernetes_env
    from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator
    from airflow_spot.operators.spot import SpotJobOperator

    for name, value in kubernetes_env(Path("/nowhere/kubeconfig")).items():
        monkeypatch.setenv(name, value)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["spot_ml_pipeline"]
    train = dag.get_task("train")
    assert isinstance(train, SpotKubernetesPodOperator) and train.deferrable
    assert train.kubernetes_conn_id == "spot_kubernetes" and train.settings.max_preemptions == 2
    shards = dag.get_task("batch_inference")
    assert shards.operator_class is SpotJobOperator
    assert shards.partial_kwargs["provider"] == "kubernetes"


def test_the_airflow_demo_on_kubernetes_without_the_emulators_names_the_extra(tmp_path):
    """The emulator is the separate distribution spot-pipelines-emulators: without it the
    Airflow demo says which extra to install in one line (exit 2), before it sets up
    Airflow's database."""
    from tests.support.no_emulators import env_without_emulators

    env = {
        k: v
        for k, v in env_without_emulators(tmp_path / "site").items()
        if not k.startswith("AIRFLOW")
    }
    cli = Path(sys.executable).parent / "spot-pipelines"
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [str(cli), "demo", "--engine", "airflow", "--provider", "kubernetes"]
        + ["--workdir", str(workdir)],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert 'pip install "spot-pipelines[emulators]"' in lines[0]
    assert not (workdir / "airflow_home").exists()


@pytest.mark.slow
def test_make_demo_engine_airflow_provider_kubernetes_holds_the_contract(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    cli = Path(sys.executable).parent / "spot-pipelines"
    done = subprocess.run(
        [
            str(cli),
            "demo",
            "--engine",
            "airflow",
            "--provider",
            "kubernetes",
            "--json",
            "--workdir",
            str(tmp_path),
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["engine"] == "airflow"
    assert result["preemptions"] >= 2 and result["fallbacks"] >= 1
    assert result["final_weights_sha256"] == result["uninterrupted_weights_sha256"]
    assert result["spot_cost"] < result["on_demand_cost"]
    report = json.loads(next((tmp_path / "runs").glob("*/report.json")).read_text())
    pools = [a["pool"] for a in report["train_record"]["attempts"]]
    preempted = [
        p["zone"]
        for p, a in zip(pools, report["train_record"]["attempts"], strict=True)
        if a["outcome"] == "preempted"
    ]
    assert len(set(preempted)) >= 2, "two different spot node pools (flavours) were reclaimed"
    assert pools[-1]["market"] == "on-demand"
