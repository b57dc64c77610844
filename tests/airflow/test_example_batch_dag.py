"""The batch inference example DAG: workers mapped over one queue on the local spot cloud,
reclaimed on the way, and a final task that passes only when every unit is done once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pushed(run, task_id: str, key: str):
    """What a task of ``run`` pushed to XCom under ``key``, from the metadata database."""
    import json

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == run.dag_id,
                XComModel.run_id == run.run_id,
                XComModel.task_id == task_id,
                XComModel.key == key,
            )
        )
    try:
        return json.loads(value) if isinstance(value, (str, bytes)) else value
    except ValueError:
        return value  # a plain string


def forget_providers(url: str | None = None) -> None:
    """Close the ``local`` providers this process's SpotHook cached (per process, keyed by
    the provider's options): before the run, so the DAG reaches this test's cloud server
    (named in the environment), not one an earlier test left cached; after it, so the
    next DAG test does not reach this stopped one."""
    from airflow_spot.hooks.spot import SpotHook

    SpotHook("local").close()
    if url is not None:
        SpotHook("local", {"url": url}).close()


def load_batch_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "spot_batch_inference.py"))
    assert bag.import_errors == {}
    return bag.dags["spot_batch_inference"]


def test_batch_dag_imports_with_zero_import_errors(airflow_home):
    dag = load_batch_dag()
    assert {t.task_id for t in dag.tasks} == {"make_queue", "workers", "queue_progress"}
    assert dag.get_task("workers").partial_kwargs["deferrable"]


@pytest.mark.timeout(600)
def test_batch_dag_finishes_every_unit_once_through_reclaims(tmp_path, airflow_home):

    from conftest import load_dag

    from airflow_spot.demo import cloud_server
    from spot_core.localcloud.server import client_environ
    from spot_core.workloads.batch import WorkQueue, outputs_sha256
    from spot_core.workloads.batch_inference import infer

    with cloud_server(
        tmp_path / "cloud", time_scale=3600.0, start_tick=450, start_on_first_client=True
    ) as url:
        environ = client_environ(url, tmp_path / "cloud")
        saved = {name: os.environ.get(name) for name in environ}
        os.environ.update(environ)
        forget_providers()
        try:
            run = load_dag("spot_batch_inference").test(
                run_conf={"workdir": str(tmp_path), "items": 300, "unit_size": 10}
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            forget_providers(url)
    tis = {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}
    assert run.state == "success", {k: ti.state for k, ti in tis.items()}
    assert sorted(i for t, i in tis if t == "workers") == [0, 1, 2]
    assert all(tis[("workers", i)].try_number == 1 for i in range(3)), "a reclaim spent a retry"
    summaries = [tis[("workers", i)].xcom_pull(task_ids="workers", map_indexes=i) for i in range(3)]
    assert sum(s["preemptions"] for s in summaries) >= 1
    progress = pushed(run, "queue_progress", "return_value")
    assert progress["complete"] and progress["done"] == 30 and progress["failed"] == 0
    [queue_dir] = list((tmp_path / "runs").glob("*/queue"))
    queue = WorkQueue.open(queue_dir.as_uri())
    items = [o["item"] for _, outs in queue.outputs() for o in outs]
    assert sorted(items) == list(range(300))
    plain = [(u, [infer(i) for i in queue.spec.unit_items(u)]) for u in queue.spec.unit_ids()]
    assert progress["outputs_sha256"] == outputs_sha256(plain)
    # The Spot tab of a worker shows the run's queue, read live from its store.
    from airflow.utils.session import create_session

    from airflow_spot.ui.jobs import load_queue
    from airflow_spot.ui.pages import task_tab

    with create_session() as session:
        queue_view = load_queue(session, "spot_batch_inference", run.run_id)
    assert queue_view["done"] == 30 and queue_view["uri"] == queue_dir.as_uri()
    html = task_tab(
        None,
        dag_id="spot_batch_inference",
        run_id=run.run_id,
        task_id="workers",
        map_index=0,
        now=0.0,
        queue=queue_view,
    )
    assert "Work queue" in html and '<td class="num">30</td>' in html
