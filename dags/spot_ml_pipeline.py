"""An ML pipeline whose heavy steps run on spot capacity and survive preemptions.

prepare data -> train (SpotJobOperator on the local spot cloud replaying a real AWS V100
availability trace; preempted, resumes from checkpoints, falls back to on-demand) ->
evaluate -> batch inference mapped over shards (each shard its own spot job) -> report.

The local cloud is a server (``python -m spot_core.localcloud.server``) whose URL is in
``SPOT_LOCAL_CLOUD_URL`` and token in ``SPOT_LOCAL_CLOUD_TOKEN``, so the worker that
launches a lease and the triggerer that watches it see the same instances.
``SPOT_PIPELINE_WORKDIR`` is where data, checkpoints and predictions go.

With ``SPOT_PIPELINE_PROVIDER=kubernetes`` the same steps run as pods on Kubernetes spot
node pools instead: training through ``SpotKubernetesPodOperator`` on the cluster of the
Airflow connection ``spot_kubernetes``, the inference shards through
``SpotJobOperator(provider="kubernetes")`` with the kubeconfig in
``SPOT_PIPELINE_KUBECONFIG`` (``make demo ENGINE=airflow PROVIDER=kubernetes`` sets both
up on the Kubernetes emulator).
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_spot.operators.spot import SpotJobOperator
from spot_core.demo.kubernetes import PRICES
from spot_core.workloads.example_pipeline import evaluate, infer_command, train_command

WORKDIR = os.environ.get("SPOT_PIPELINE_WORKDIR", "/tmp/spot-ml-pipeline")
PROVIDER = os.environ.get("SPOT_PIPELINE_PROVIDER", "local")
SHARDS = 3
RUN_DIR = "{{ params.workdir }}/runs/{{ run_id | pathsafe }}"
DATA = RUN_DIR + "/data/dataset.npz"
MODEL_URI = "file://" + RUN_DIR + "/checkpoints/train"


# The same spot settings for training and every inference shard: the local cloud, two
# preemptions before on-demand, bounded waits, and the triggerer watching each lease.
SETTINGS = dict(
    max_preemptions=2,
    capacity_wait=0.5,
    max_capacity_waits=20,
    poll_interval=0.2,
    attempt_timeout=timedelta(minutes=10),
    deferrable=True,
)
SPOT = dict(provider="local", **SETTINGS)
# On Kubernetes: the step image's watcher (the emulator's kubelet runs it on this machine,
# so this interpreter's), and $/h per node pool (no cluster API says what a node costs).
K8S_OPTIONS = {
    "watch_command": [sys.executable, "-m", "spot_core.cli"],
    "watch_poll_interval": 0.2,
    "node_refresh_seconds": 0.5,
    "prices": PRICES,
}
K8S_IMAGE = "spot-pipelines-step:demo"
if PROVIDER == "kubernetes":
    SPOT = dict(
        provider="kubernetes",
        **SETTINGS,
        provider_options={
            **K8S_OPTIONS,
            "image": K8S_IMAGE,
            "kubeconfig": os.environ.get("SPOT_PIPELINE_KUBECONFIG", "/nonexistent/kubeconfig"),
        },
    )


def _pathsafe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-")


with DAG(
    dag_id="spot_ml_pipeline",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["spot", "ml", "example"],
    user_defined_filters={"pathsafe": _pathsafe},
    params={
        "workdir": Param(WORKDIR, type="string"),
        "steps": Param(2000, type="integer", minimum=200),
        "step_seconds": Param(0.03, type="number"),
        "checkpoint_every_seconds": Param(1.0, type="number"),
    },
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
):

    @task
    def prepare(params=None, run_id=None) -> str:
        from pathlib import Path

        from spot_core.workloads.softmax_regression import TrainConfig, prepare_dataset

        path = Path(params["workdir"]) / "runs" / _pathsafe(run_id) / "data" / "dataset.npz"
        return str(prepare_dataset(TrainConfig(), path))

    TRAIN = train_command(
        DATA,
        "{{ params.steps }}",
        "{{ params.step_seconds }}",
        "{{ params.checkpoint_every_seconds }}",
    )
    if PROVIDER == "kubernetes":
        # Imported only here: the pod operator brings the Kubernetes clients, seconds of
        # parse time a local-provider DAG should not pay.
        from kubernetes.client import models as k8s

        from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator

        train = SpotKubernetesPodOperator(
            task_id="train",
            kubernetes_conn_id="spot_kubernetes",
            image=K8S_IMAGE,
            cmds=TRAIN,
            env_vars={"PIPELINE": "spot_ml_pipeline"},
            checkpoint_uri=MODEL_URI,
            # the work folder (data, checkpoints) in every pod: a PVC on a real cluster
            volumes=[k8s.V1Volume(name="work", host_path=k8s.V1HostPathVolumeSource(WORKDIR))],
            volume_mounts=[k8s.V1VolumeMount(name="work", mount_path=WORKDIR)],
            provider_options=K8S_OPTIONS,
            **SETTINGS,
        )
    else:
        train = SpotJobOperator(task_id="train", command=TRAIN, checkpoint_uri=MODEL_URI, **SPOT)

    @task
    def evaluate_model(params=None, run_id=None) -> dict:
        run_dir = f"{params['workdir']}/runs/{_pathsafe(run_id)}"
        return evaluate(
            f"file://{run_dir}/checkpoints/train",
            f"{run_dir}/data/dataset.npz",
            int(params["steps"]),
        )

    @task
    def shard_commands(params=None, run_id=None) -> list[list[str]]:
        run_dir = f"{params['workdir']}/runs/{_pathsafe(run_id)}"
        return [
            infer_command(
                f"file://{run_dir}/checkpoints/train",
                f"{run_dir}/data/dataset.npz",
                shard,
                SHARDS,
                f"{run_dir}/predictions/shard-{shard}.npy",
            )
            for shard in range(SHARDS)
        ]

    inference = SpotJobOperator.partial(
        task_id="batch_inference",
        checkpoint_uri="file://" + RUN_DIR + "/checkpoints/infer-{{ ti.map_index }}",
        **SPOT,
    ).expand(command=shard_commands())

    @task
    def report(evaluation: dict, ti=None, params=None, run_id=None) -> dict:
        import json
        from pathlib import Path

        from spot_core.model import JobRecord

        record = ti.xcom_pull(task_ids="train", key="spot_job_record")
        train_summary = JobRecord.from_dict(record).summary()
        shards = ti.xcom_pull(task_ids="batch_inference") or []
        result = {
            "engine": "airflow",
            "attempts": train_summary["attempts"],
            "preemptions": train_summary["preemptions"],
            "fallbacks": train_summary["fallbacks"],
            "resumed_from_steps": train_summary["resumed_from_steps"],
            "spot_cost": train_summary["spot_cost"],
            "on_demand_cost": train_summary["on_demand_cost"],
            "savings_fraction": train_summary["savings_fraction"],
            "lost_work_seconds": train_summary["lost_work_seconds"],
            "time_to_resume_seconds": train_summary["time_to_resume_seconds"],
            **evaluation,
            "inference_shards": len(list(shards)),
            "inference_preemptions": sum(s["preemptions"] for s in shards),
        }
        out = Path(params["workdir"]) / "runs" / _pathsafe(run_id) / "report.json"
        out.write_text(json.dumps({"result": result, "train_record": record}))
        print(json.dumps(result))
        return result

    evaluation = evaluate_model()
    prepare() >> train >> evaluation >> inference
    inference >> report(evaluation)
