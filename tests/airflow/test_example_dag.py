"""The example DAG imports cleanly and runs to success under dag.test(), preempted on the way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_example_dag_imports_with_zero_import_errors(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["spot_ml_pipeline"]
    assert {t.task_id for t in dag.tasks} == {
        "prepare",
        "train",
        "evaluate_model",
        "shard_commands",
        "batch_inference",
        "report",
    }
    assert dag.get_task("train").deferrable
    assert bag.dags["spot_first_task"].get_task("train").deferrable  # the docker/ stack's


def test_pipeline_succeeds_with_preemptions_and_no_retry_spent(pipeline_run):
    run, tis, report = pipeline_run
    assert run.state == "success", {k: ti.state for k, ti in tis.items()}
    train = tis[("train", -1)]
    assert train.try_number == 1, "a preemption consumed an Airflow retry"
    summary = train.xcom_pull(task_ids="train")
    assert summary["status"] == "succeeded"
    assert summary["preemptions"] >= 2
    assert summary["attempts"] >= 3 and summary["fallbacks"] >= 1
    record = train.xcom_pull(task_ids="train", key="spot_job_record")
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert outcomes.count("preempted") == summary["preemptions"] and outcomes[-1] == "succeeded"


def test_training_resumed_from_checkpoints_and_matches_an_uninterrupted_run(pipeline_run):
    _, _, report = pipeline_run
    result = report["result"]
    assert result["final_weights_sha256"] == result["uninterrupted_weights_sha256"]
    assert result["resumed_from_steps"] and all(s > 0 for s in result["resumed_from_steps"])
    assert result["accuracy"] > 0.8
    assert 0 < result["spot_cost"] < result["on_demand_cost"]


def test_batch_inference_ran_one_spot_job_per_shard(pipeline_run, workdir):
    run, tis, report = pipeline_run
    shards = sorted(k[1] for k in tis if k[0] == "batch_inference")
    assert shards == [0, 1, 2]
    assert all(tis[("batch_inference", i)].state == "success" for i in shards)
    assert all(tis[("batch_inference", i)].try_number == 1 for i in shards)
    predictions = sorted((workdir / "runs").glob("*/predictions/shard-*.npy"))
    assert len(predictions) == 3
    assert report["result"]["inference_shards"] == 3


def test_links_and_record_are_in_xcom(pipeline_run, workdir):
    _, tis, _ = pipeline_run
    train = tis[("train", -1)]
    link = train.xcom_pull(task_ids="train", key="spot_checkpoint_link")
    assert link.startswith("file://") and link.endswith("/checkpoints/train")
    assert train.xcom_pull(task_ids="train", key="spot_ec2_instance_link") == ""


def test_no_lease_outlives_the_run(pipeline_run, pipeline_cloud, workdir):
    from spot_core.localcloud.server import read_token
    from spot_core.providers.local import LocalProvider

    provider = LocalProvider.connect(pipeline_cloud, token=read_token(workdir / "pipeline-cloud"))
    _, tis, _ = pipeline_run
    record = tis[("train", -1)].xcom_pull(task_ids="train", key="spot_job_record")
    ids = [a["lease_id"] for a in record["attempts"] if a["lease_id"]]
    views = provider.cloud.describe(ids)
    assert views and not any(v.running for v in views.values())


def test_airflow_lists_the_provider(airflow_home):
    airflow = Path(sys.executable).parent / "airflow"
    out = subprocess.run(
        [str(airflow), "providers", "list", "-o", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    names = {p["package_name"] for p in json.loads(out[out.index("[") :])}
    assert "spot-pipelines" in names


def test_provider_info_names_importable_things():
    import importlib

    from airflow_spot.get_provider_info import get_provider_info

    info = get_provider_info()
    assert info["package-name"] == "spot-pipelines"
    for kind in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for path in [
        *info["extra-links"],
        info["task-decorators"][0]["class-name"],
        info["plugins"][0]["plugin-class"],
    ]:
        module, _, name = path.rpartition(".")
        assert getattr(importlib.import_module(module), name)
