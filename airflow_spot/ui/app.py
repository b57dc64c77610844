"""The Spot UI's FastAPI app, mounted by the plugin under the API server at ``/spot``.

Plugin apps are not protected by Airflow: this one applies Airflow's authentication and
DAG-level authorization itself, with Airflow's own pieces. The user comes from the JWT
(``Authorization: Bearer`` for scripts; the UI's ``_token`` cookie, which the browser
sends with the same-origin iframe Airflow renders for an external view), resolved by the
auth manager exactly as ``/api/v2`` resolves it: no or a bad token is 401/403. Only DAGs
the auth manager lets the user read (``get_authorized_dag_ids``) are ever queried, so a
user sees none of the jobs of a DAG they may not read.

Airflow's modules are imported inside the handlers: the plugin is loaded by every
Airflow component, and only the API server serves this app.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

URL_PREFIX = "/spot"
app = FastAPI(title="Spot pipelines", docs_url=None, redoc_url=None, openapi_url=None)
_bearer = HTTPBearer(auto_error=False)


async def current_user(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)] = None,
):
    """The Airflow user of this request (bearer token first, then the UI's cookie)."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, None, bearer)


User = Annotated[Any, Depends(current_user)]


def _session():
    from airflow.utils.session import create_session

    with create_session(scoped=False) as session:
        yield session


Session = Annotated[Any, Depends(_session)]


def readable_dag_ids(user, session) -> frozenset[str]:
    """The DAGs whose jobs this user may see: those the auth manager lets them read."""
    from airflow.api_fastapi.app import get_auth_manager

    return frozenset(
        get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session)
    )


def _may_read_task_instances(user, dag_id: str, session) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.models.dag import DagModel

    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id, session=session))
    return get_auth_manager().is_authorized_dag(
        method="GET", user=user, details=details, access_entity=DagAccessEntity.TASK_INSTANCE
    )


def _map_index(text: str) -> int:
    """Airflow fills ``{MAP_INDEX}`` for mapped task instances only; else it is -1."""
    try:
        return int(text)
    except ValueError:
        return -1


@app.get("/ti/{dag_id}/{run_id}/{task_id}/{map_index}", response_class=HTMLResponse)
def spot_tab(
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: str,
    user: User,
    session: Session,
) -> Response:
    """The Spot tab of one task instance (Airflow's external view, in an iframe)."""
    from airflow_spot.ui.jobs import Where, load_jobs, load_queue, with_handover
    from airflow_spot.ui.pages import task_tab

    if not _may_read_task_instances(user, dag_id, session):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"you may not read DAG {dag_id!r}")
    index = _map_index(map_index)
    if str(index) != map_index:
        # Airflow leaves "{MAP_INDEX}" in the iframe's URL for an unmapped task: send the
        # frame to the filled URL (relative: the last segment becomes "-1").
        return RedirectResponse(f"./{index}", status.HTTP_307_TEMPORARY_REDIRECT)
    jobs, _ = load_jobs(
        session,
        Where(frozenset({dag_id}), dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=index),
    )
    return HTMLResponse(
        task_tab(
            with_handover(jobs[0]) if jobs else None,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=index,
            now=time.time(),
            queue=load_queue(session, dag_id, run_id),
        )
    )


@app.get("/jobs", response_class=HTMLResponse)
def spot_jobs(user: User, session: Session) -> HTMLResponse:
    """The Spot jobs page (Airflow's navigation entry)."""
    from airflow_spot.ui.jobs import MAX_JOBS, Where, load_jobs
    from airflow_spot.ui.pages import jobs_page

    jobs, unreadable = load_jobs(session, Where(readable_dag_ids(user, session)))
    return HTMLResponse(jobs_page(jobs, unreadable=unreadable, limit=MAX_JOBS, now=time.time()))


@app.get("/api/jobs")
def spot_jobs_json(user: User, session: Session, dag_id: str | None = None) -> dict:
    """The same jobs as JSON: where each lives, its task state, its record's summary."""
    from airflow_spot.ui.jobs import Where, load_jobs

    jobs, unreadable = load_jobs(session, Where(readable_dag_ids(user, session), dag_id=dag_id))
    return {
        "jobs": [
            {
                "dag_id": j.dag_id,
                "run_id": j.run_id,
                "task_id": j.task_id,
                "map_index": j.map_index,
                "state": j.state,
                "source": j.source,
                "running": j.running,
                "summary": j.record.summary(),
            }
            for j in jobs
        ],
        "unreadable": unreadable,
    }
