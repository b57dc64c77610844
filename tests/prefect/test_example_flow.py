"""The example flow on a real Prefect server: preempted twice, resumed, same weights;
its artifacts carry the job's numbers."""

from __future__ import annotations

import json

import pytest

from prefect_spot.artifacts import artifact_key
from prefect_spot.demo import demo_json, load_example_flows
from spot_core.charts.clock import money
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
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
        notes = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-summary"]))
        )
    assert len(tables) == 1 and tables[0].type == "table"
    assert tables[0].task_run_id is not None and tables[0].flow_run_id is not None
    rows = json.loads(tables[0].data) if isinstance(tables[0].data, str) else tables[0].data
    assert [r["attempt"] for r in rows] == [a.number for a in record.attempts]
    assert [r["outcome"] for r in rows] == [str(a.outcome) for a in record.attempts]
    assert [r["market"] for r in rows] == [str(a.pool.market) for a in record.attempts]
    assert [r["resumed from step"] for r in rows] == [
        "-" if a.checkpoint_step_start is None else a.checkpoint_step_start for a in record.attempts
    ]
    assert [r["cost"] for r in rows] == [money(a.cost) for a in record.attempts]
    assert rows[-1]["market"] == str(Market.ON_DEMAND) or record.fallbacks == 0
    markdown = notes[0].data
    summary = record.summary()
    assert f"| preemptions | {summary['preemptions']} |" in markdown
    assert f"| spot cost | {money(record.ledger.spent)} |" in markdown
    assert f"| on-demand equivalent | {money(record.ledger.on_demand_equivalent)} |" in markdown
    assert f"({summary['savings_fraction']:.0%})" in markdown


def test_events_reach_prefect_for_automations(pipeline_run):
    import time

    from prefect import get_client
    from prefect.events.worker import EventsWorker

    _, record = pipeline_run
    EventsWorker.drain_all(timeout=10)
    wanted = {
        "spot.job.launched",
        "spot.job.preempted",
        "spot.job.resumed",
        "spot.job.fallback",
        "spot.job.succeeded",
    }
    events: list[dict] = []
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and not wanted <= {e["event"] for e in events}:
            response = client.request(
                "POST",
                "/events/filter",
                json={
                    "filter": {
                        "event": {"prefix": ["spot.job."]},
                        "any_resource": {"id": [f"spot.job.{record.job_id}"]},
                        "occurred": {"since": "2000-01-01T00:00:00Z"},
                    },
                    "limit": 50,
                },
            )
            events = response.json()["events"]
            time.sleep(1)
    names = {e["event"] for e in events}
    assert wanted <= names, names
    # one resource per job, and the numbers an automation or a dashboard needs
    assert {e["resource"]["prefect.resource.id"] for e in events} == {f"spot.job.{record.job_id}"}
    succeeded = next(e for e in events if e["event"] == "spot.job.succeeded")
    metrics = succeeded["payload"]["metrics"]
    assert metrics["preemptions"] == record.preemptions
    assert metrics["fallbacks"] == record.fallbacks
    assert metrics["attempts"] == len(record.attempts)
    assert metrics["spot_cost"] == pytest.approx(record.ledger.spent, abs=1e-5)
    assert metrics["saved"] == pytest.approx(record.ledger.saved, abs=1e-5)
    assert metrics["lost_work_seconds"] == pytest.approx(record.ledger.lost_work_seconds, abs=0.01)
    assert metrics["pool"] == record.attempts[-1].pool.key
    resumed = sorted(
        (e for e in events if e["event"] == "spot.job.resumed"), key=lambda e: e["occurred"]
    )
    assert [e["payload"]["metrics"]["resumed_from_step"] for e in resumed] == record.summary()[
        "resumed_from_steps"
    ]


def test_progress_and_chart_artifacts_follow_the_job(pipeline_run):
    import base64
    import re
    import xml.etree.ElementTree as ET

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    _, record = pipeline_run
    key = artifact_key(record)
    with get_client(sync_client=True) as client:
        progress = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-progress"]))
        )
        charts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-chart"]))
        )
    # one progress artifact, updated in place as attempts started and ended
    assert len(progress) == 1 and progress[0].type == "progress"
    assert float(progress[0].data) == 100.0
    assert progress[0].updated > progress[0].created
    assert f"ended succeeded; preemptions {record.preemptions}" in progress[0].description
    # the job ended: its whole saving, in the record's clock (the trace's capacity time)
    assert re.search(
        r"capacity time, [\d.]+x\): saved \$[\d.,]+ \(\d+%\)$", progress[0].description
    )
    assert progress[0].task_run_id is not None
    assert len(charts) == 1 and charts[0].type == "markdown"
    images = re.findall(
        r"!\[[^\]]*\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", charts[0].data
    )
    assert len(images) == 2
    timeline = ET.fromstring(base64.b64decode(images[0]))
    bars = [
        e
        for e in timeline.iter("{http://www.w3.org/2000/svg}rect")
        if "attempt" in e.get("class", "").split()
    ]
    assert [b.get("data-outcome") for b in bars] == [str(a.outcome) for a in record.attempts]
