"""The Spot UI app inside Airflow's real API server app (``create_app``), in process, on the
session's SQLite metadata database: authentication, DAG-level authorization through the
simple auth manager's teams, and what the tab and the jobs page show.

The records are written where ``airflow_spot/records.py`` writes them (the task state
store table), for two DAGs: ``ui_open`` (no team) and ``ui_research`` (in a bundle owned
by the team ``research``). Tokens come from the auth manager itself, as ``/auth/token``
issues them.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool

RUN_ID = "manual__ui"
SPOT = Pool("local", "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)


def _record(job_id: str) -> JobRecord:
    """Preempted on spot (with a notice), then finished on on-demand: a fallback."""
    record = JobRecord(job_id=job_id, created_at=1_700_000_000.0)
    first = Attempt(
        1,
        SPOT,
        1_700_000_010.0,
        lease_id="l-1",
        lease={
            "lease_id": "l-1",
            "pool": SPOT.to_dict(),
            "job_id": job_id,
            "attempt": 1,
            "started_at": 1_700_000_010.0,
            "price_per_hour": 0.91,
            "details": {},
        },
    )
    record = record.start_attempt(first).finish_attempt(
        Attempt(
            1,
            SPOT,
            1_700_000_010.0,
            lease_id="l-1",
            lease=first.lease,
            ended_at=1_700_003_610.0,
            outcome=Outcome.PREEMPTED,
            cost=0.91,
            on_demand_cost=3.06,
            checkpoint_step_end=300,
            lost_work_seconds=42.0,
            notice_at=1_700_003_500.0,
            message="<script>alert(1)</script> reclaimed",
        )
    )
    od = SPOT.on(Market.ON_DEMAND)
    record = record.start_attempt(
        Attempt(2, od, 1_700_003_700.0, lease_id="l-2", checkpoint_step_start=300)
    )
    return record.finish_attempt(
        Attempt(
            2,
            od,
            1_700_003_700.0,
            lease_id="l-2",
            checkpoint_step_start=300,
            ended_at=1_700_005_500.0,
            outcome=Outcome.SUCCEEDED,
            cost=1.53,
            on_demand_cost=1.53,
            resumed_at=1_700_003_742.5,  # its first step, 242.5 s after the notice
        )
    )


def _running(job_id: str, checkpoint_uri: str | None = None) -> JobRecord:
    """One attempt on a spot lease, still running."""
    lease = {
        "lease_id": "l-live",
        "pool": SPOT.to_dict(),
        "job_id": job_id,
        "attempt": 1,
        "started_at": 1_700_000_000.0,
        "price_per_hour": 0.88,
        "details": {},
    }
    return JobRecord(
        job_id=job_id, created_at=1_700_000_000.0, checkpoint_uri=checkpoint_uri
    ).start_attempt(Attempt(1, SPOT, 1_700_000_000.0, lease_id="l-live", lease=lease))


def _handing_over(folder) -> str:
    """A job's store in which its trigger recorded the replacement it launched on attempt
    1's notice (as ``Handover.hand_over`` writes it): the store's URI."""
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.handover import mark_launched

    uri = folder.as_uri()
    pool = Pool("local", "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)
    lease = {
        "lease_id": "l-next",
        "pool": pool.to_dict(),
        "job_id": "ui_open.swap",
        "attempt": 2,
        "started_at": 1_700_000_400.0,
        "price_per_hour": 0.95,
        "details": {},
    }
    mark_launched(
        open_store(uri),
        1,
        {
            "attempt": 2,
            "lease": lease,
            "launched_at": 1_700_000_400.0,
            "state": "launched",
            "reason": "resuming on spot in us-east-1b p3.2xlarge after preemption 1",
        },
    )
    return uri


@pytest.fixture(scope="module")
def client(airflow_home, tmp_path_factory):
    from airflow.api_fastapi.app import create_app, purge_cached_app
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.team import Team
    from airflow.utils.session import create_session
    from fastapi.testclient import TestClient
    from sqlalchemy import insert, select

    with create_session() as session:
        bundles = {
            name: session.merge(DagBundleModel(name=name)) for name in ("ui-open", "ui-research")
        }
        bundles["ui-research"].teams.append(session.merge(Team(name="research")))
        session.flush()
        for dag_id, bundle in (("ui_open", "ui-open"), ("ui_research", "ui-research")):
            session.merge(DagModel(dag_id=dag_id, bundle_name=bundle, fileloc="/dev/null"))
            run = DagRun(
                dag_id=dag_id,
                run_id=RUN_ID,
                run_type="manual",
                state="success",
                run_after=datetime.now(UTC),
            )
            session.add(run)
            session.flush()
            session.add(
                TaskStateStoreModel(
                    dag_run_id=run.id,
                    task_id="train",
                    map_index=-1,
                    key="spot_job_record",
                    dag_id=dag_id,
                    run_id=RUN_ID,
                    value=json.dumps(_record(f"{dag_id}.train").to_dict()),
                )
            )
        # A deferred task whose job holds a lease now (a task instance row as the scheduler
        # keeps it; the record where the operator writes it).
        session.execute(
            insert(TaskInstance.__table__).values(
                id=uuid.uuid4(),
                dag_id="ui_open",
                task_id="serve",
                run_id=RUN_ID,
                map_index=-1,
                state="deferred",
                pool="default_pool",
                pool_slots=1,
                try_number=1,
            )
        )
        run_id = session.scalar(select(DagRun.id).where(DagRun.dag_id == "ui_open"))
        session.add(
            TaskStateStoreModel(
                dag_run_id=run_id,
                task_id="serve",
                map_index=-1,
                key="spot_job_record",
                dag_id="ui_open",
                run_id=RUN_ID,
                value=json.dumps(_running("ui_open.serve").to_dict()),
            )
        )
        # Deferred tasks whose triggers handed over (the replacement only in the job's
        # store), one store readable here, one on another machine's disk.
        stores = {
            "swap": _handing_over(tmp_path_factory.mktemp("swap-ckpt")),
            "far": "file:///nonexistent/spot-ui-far/ckpt",
        }
        for task_id, uri in stores.items():
            session.execute(
                insert(TaskInstance.__table__).values(
                    id=uuid.uuid4(),
                    dag_id="ui_open",
                    task_id=task_id,
                    run_id=RUN_ID,
                    map_index=-1,
                    state="deferred",
                    pool="default_pool",
                    pool_slots=1,
                    try_number=1,
                )
            )
            session.add(
                TaskStateStoreModel(
                    dag_run_id=run_id,
                    task_id=task_id,
                    map_index=-1,
                    key="spot_job_record",
                    dag_id="ui_open",
                    run_id=RUN_ID,
                    value=json.dumps(_running(f"ui_open.{task_id}", uri).to_dict()),
                )
            )
    app = create_app(apps="core")
    with TestClient(app) as test_client:
        yield test_client
    purge_cached_app()


def _token(role: str, teams: list[str] | None = None) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(
        SimpleAuthManagerUser(username=f"{role}-user", role=role, teams=teams)
    )


def _as(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    "path", ["/spot/jobs", "/spot/api/jobs", f"/spot/ti/ui_open/{RUN_ID}/train/-1"]
)
def test_no_token_is_refused(client, path):
    assert client.get(path).status_code == 401
    assert client.get(path, headers=_as("not-a-jwt")).status_code in (401, 403)


def test_a_user_sees_only_the_jobs_of_dags_they_may_read(client):
    # Other tests of the session may leave spot jobs of their own (team-less) DAGs in the
    # shared metadata database: only this test's two DAGs are asserted on.
    ml = client.get("/spot/api/jobs", headers=_as(_token("viewer", ["ml"]))).json()
    ml_dags = {j["dag_id"] for j in ml["jobs"]}
    assert "ui_open" in ml_dags and "ui_research" not in ml_dags
    research = client.get("/spot/api/jobs", headers=_as(_token("viewer", ["research"]))).json()
    assert {"ui_open", "ui_research"} <= {j["dag_id"] for j in research["jobs"]}
    page = client.get("/spot/jobs", headers=_as(_token("viewer", ["ml"]))).text
    assert "ui_open" in page and "ui_research" not in page
    tab = client.get(
        f"/spot/ti/ui_research/{RUN_ID}/train/-1", headers=_as(_token("viewer", ["ml"]))
    )
    assert tab.status_code == 403 and "ui_research.train" not in tab.text


def test_the_ui_cookie_authenticates_the_iframe(client):
    client.cookies.set("_token", _token("viewer", ["ml"]))
    try:
        assert client.get("/spot/jobs").status_code == 200
    finally:
        client.cookies.clear()


def test_an_unfilled_map_index_is_sent_to_the_filled_url(client):
    """Airflow fills {MAP_INDEX} only for a mapped task: the frame goes to the -1 URL."""
    tab = client.get(
        f"/spot/ti/ui_open/{RUN_ID}/train/{{MAP_INDEX}}",
        headers=_as(_token("viewer")),
        follow_redirects=False,
    )
    assert tab.status_code == 307 and tab.headers["location"] == "./-1"
    followed = client.get(
        f"/spot/ti/ui_open/{RUN_ID}/train/{{MAP_INDEX}}", headers=_as(_token("viewer"))
    )
    assert followed.status_code == 200 and str(followed.url).endswith("/train/-1")


def test_the_tab_shows_each_attempt_its_costs_and_escapes_the_record(client):
    tab = client.get(f"/spot/ti/ui_open/{RUN_ID}/train/-1", headers=_as(_token("viewer")))
    assert tab.status_code == 200, tab.text
    html = tab.text
    assert len(re.findall(r'<tr class="attempt-row">', html)) == 2
    assert len(re.findall(r'<rect[^>]*class="attempt ', html)) == 2  # one bar per attempt
    assert "preempted" in html and "succeeded" in html and "on-demand" in html
    assert "$2.44" in html and "$4.59" in html  # spot cost and on-demand equivalent
    assert "notice 23:11:40" in html  # the notice time (UTC), in the attempt's row
    # the job ran 91 minutes of wall time: every duration in minutes, said once
    assert "wall time, durations in minutes" in html
    assert re.search(r"<td[^>]*>4.0</td>", html) and "from step 300 in 4.0 min" in html
    headings = re.findall(r"<th>(.*?)</th>", html)
    assert all(h and "_" not in h for h in headings), headings  # words, no empty header
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "default-src 'none'" in html  # no script runs in Airflow's iframe


def test_the_jobs_page_sums_savings_and_pool_interruptions(client):
    html = client.get("/spot/jobs", headers=_as(_token("admin"))).text
    savings = html.split('class="savings"')[1].split("</table>")[0]
    assert "ui_open" in savings and "$2.15" in savings  # 4.59 on-demand - 2.44 paid
    pools = html.split('class="pools"')[1].split("</table>")[0]
    # two preemptions in two spot hours in us-east-1a/p3.2xlarge; newest lease price 0.91
    assert "us-east-1a/p3.2xlarge" in pools and ">1.00<" in pools and "$0.91/h" in pools
    running = html.split('class="running"')[1].split("</table>")[0]
    assert running.count('class="running-row"') == 3  # finished jobs are not running
    assert "serve" in running and "deferred" in running and "l-live" in running
    assert "$0.88/h" in running


def test_a_task_without_a_spot_record_says_so(client):
    html = client.get(f"/spot/ti/ui_open/{RUN_ID}/prepare/-1", headers=_as(_token("admin")))
    assert html.status_code == 200 and "no spot job record" in html.text


def test_a_deferred_tasks_tab_shows_the_replacement_its_trigger_launched(client):
    """The record in the task state store is the one the task deferred with; the
    replacement its trigger launched on the notice is read from the job's store."""
    html = client.get(f"/spot/ti/ui_open/{RUN_ID}/swap/-1", headers=_as(_token("viewer"))).text
    assert html.count('class="attempt-row"') == 1
    (row,) = re.findall(r'<tr class="handover-row">(.*?)</tr>', html)
    assert ">2<" in row and "us-east-1b p3.2xlarge" in row and "handing over" in row
    assert "2023-11-14 22:20:00" in row  # launched at (UTC)
    assert "the handover from the job&#x27;s store" in html
    # a store on another machine's disk: the stored record as it is, nothing created here
    far = client.get(f"/spot/ti/ui_open/{RUN_ID}/far/-1", headers=_as(_token("viewer")))
    assert far.status_code == 200 and "handover-row" not in far.text
    assert not Path("/nonexistent/spot-ui-far").exists()


def test_the_jobs_page_gives_rates_in_the_clock_of_its_costs():
    """On a trace market (1 wall second billed as an hour) the pool table printed 2251.56
    interruptions per hour and 0.001 hours on spot: wall hours beside trace-hour costs."""
    import dataclasses

    from airflow_spot.ui.jobs import SpotJob
    from airflow_spot.ui.pages import jobs_page

    trace = dataclasses.replace(_record("ui_trace.train"), time_scale=3600.0)
    # shrink the wall spans to seconds, as the local cloud runs them
    attempts = tuple(
        dataclasses.replace(
            a,
            started_at=1_700_000_000.0 + i * 2,
            ended_at=1_700_000_001.6 + i * 2,
            notice_at=None,
            resumed_at=None,
        )
        for i, a in enumerate(trace.attempts)
    )
    trace = dataclasses.replace(trace, attempts=attempts)
    failed = dataclasses.replace(trace, job_id="ui_trace.late").with_status("failed")
    jobs = [
        SpotJob("ui_trace", RUN_ID, task, -1, record, "xcom", "success", None)
        for task, record in (("train", trace), ("late", failed))
    ]
    html = jobs_page(jobs, unreadable=0, limit=500, now=1_700_000_010.0)
    assert "1 wall second as 1 h of capacity (time scale 3600)" in html
    pools = html.split('class="pools"')[1].split("</table>")[0]
    # two jobs, each 1 preemption in 1.6 trace hours on spot: 2 in 3.2 h
    assert "capacity hours on spot" in pools and ">3.20<" in pools and ">0.63<" in pools
    jobs_rows = html.split('class="jobs"')[1].split("</table>")[0]
    assert "no saving (the job failed)" in jobs_rows
