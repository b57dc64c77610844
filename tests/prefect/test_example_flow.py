"""The example flow on a real Prefect server: preempted twice, resumed, same weights;
its artifacts carry the job's numbers."""

from __future__ import annotations

import json

import pytest

from prefect_spot.artifacts import artifact_key
from prefect_spot.demo import demo_json, load_example_flows
from spot_core.model import JobRecord, Market, Outcome
from spot_core.workloads.softmax_regression import TrainConfig, train


@pytest.fixture(scope="module")
def pipeline_run(prefect_server, tmp_path_factory):
    flows = load_example_flows()
    workdir = tmp_path_factory.mktemp("pipeline")
    result = flows.spot_ml_pipeline(workdir=str(workdir), steps=2000)
    return result, JobRecord.from_dict(result["record"])


def test_example_flow_survives_two_preemptions_with_identical_weights(pipeline_run):
    result, record = pipeline_run
    assert record.preemptions >= 2
    assert [a.outcome for a in record.attempts[:2]] == [Outcome.PREEMPTED, Outcome.PREEMPTED]
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    resumed = record.summary()["resumed_from_steps"]
    assert len(resumed) >= 2 and all(step > 0 for step in resumed)
    assert resumed == sorted(resumed)
    assert result["training"]["resumed_from_step"] == resumed[-1]
    uninterrupted = train(TrainConfig(steps=2000)).weights_sha256
    assert result["final_weights_sha256"] == uninterrupted
    report = demo_json(record, result, uninterrupted)
    assert report["engine"] == "prefect" and report["fallbacks"] == record.fallbacks
    assert 0 < report["spot_cost"] < report["on_demand_cost"]
    assert report["accuracy"] > 0.8
    json.dumps(report)


def test_artifacts_show_the_attempts_and_the_ledger(pipeline_run):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    _, record = pipeline_run
    key = artifact_key(record)
    with get_client(sync_client=True) as client:
        tables = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        notes = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-summary"])))
    assert len(tables) == 1 and tables[0].type == "table"
    assert tables[0].task_run_id is not None and tables[0].flow_run_id is not None
    rows = json.loads(tables[0].data) if isinstance(tables[0].data, str) else tables[0].data
    assert [r["attempt"] for r in rows] == [a.number for a in record.attempts]
    assert [r["outcome"] for r in rows] == [str(a.outcome) for a in record.attempts]
    assert [r["market"] for r in rows] == [str(a.pool.market) for a in record.attempts]
    assert [r["resumed_from_step"] for r in rows] == [a.checkpoint_step_start
                                                      for a in record.attempts]
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(record.ledger.spent, abs=1e-3)
    assert rows[-1]["market"] == str(Market.ON_DEMAND) or record.fallbacks == 0
    markdown = notes[0].data
    summary = record.summary()
    assert f"| preemptions | {summary['preemptions']} |" in markdown
    assert f"${summary['spot_cost']:.4f}" in markdown
    assert f"${summary['on_demand_cost']:.4f}" in markdown
    assert f"({summary['savings_fraction']:.0%})" in markdown


def test_events_reach_prefect_for_automations(pipeline_run):
    import time

    from prefect import get_client
    from prefect.events.worker import EventsWorker

    _, record = pipeline_run
    EventsWorker.drain_all(timeout=10)
    wanted = {"spot.job.launched", "spot.job.preempted", "spot.job.fallback",
              "spot.job.succeeded"}
    names: set[str] = set()
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and not wanted <= names:
            response = client.request("POST", "/events/filter", json={
                "filter": {"event": {"prefix": ["spot.job."]},
                           "any_resource": {"id": [f"spot.job.{record.job_id}"]},
                           "occurred": {"since": "2000-01-01T00:00:00Z"}},
                "limit": 50})
            names = {e["event"] for e in response.json()["events"]}
            time.sleep(1)
    assert wanted <= names, names
