"""docker/compose.yaml works end to end, run as processes (no container engine here).

Every service's exact command and environment, as the compose implementation resolves
them, runs on this machine (stack_processes.py says how images, hostnames, ports and
volumes map): PostgreSQL, moto as the S3 store and its bucket, the local spot cloud,
`airflow db migrate`, the api-server, scheduler, dag-processor and triggerer, the Prefect
server and its spot worker. Then, side by side: a run of the spot DAG triggered through
the api-server's REST API succeeds with its checkpoints in the bucket, and a deployment
run on the spot work pool completes. Nothing is left running afterwards.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from compose_helpers import REPO, resolved_model
from stack_processes import Stack, describe, image_env

pytestmark = pytest.mark.timeout(480)

DAG_ID = "spot_first_task"
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(resolved_model(), tmp_path_factory.mktemp("stack"))
    try:
        stack.start()
        print("\nstarted, ready (s):", {k: (round(a), round(b)) for k, (a, b)
                                        in stack.timeline.items()})
        yield stack
    finally:
        before = {p.pid for p in stack_processes_of(stack)}
        began = time.monotonic()
        stack.close()
        print(f"stopped in {time.monotonic() - began:.0f} s")
        left = [pid for pid in before if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left running: {left}"


def stack_processes_of(stack: Stack) -> list[psutil.Process]:
    procs = []
    for proc in stack.procs.values():
        try:
            parent = psutil.Process(proc.pid)
            procs += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return procs


class AirflowApi:
    """The stack's api-server, through its REST API (every user is an admin locally)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        with urllib.request.urlopen(f"{self.base}/auth/token", timeout=30) as response:
            token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(
            f"{self.base}/api/v2{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}")

    def wait_for_dag(self, dag_id: str, timeout: float) -> None:
        """Until the dag-processor has parsed it and the scheduler and triggerer are up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                health = self.call("GET", "/monitor/health")
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                    self.call("GET", f"/dags/{dag_id}")
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{dag_id} never became runnable"
            time.sleep(2)


def _start_prefect_run(stack: Stack, tmp: Path) -> subprocess.Popen:
    """The example flow deployed to the worker's pool, with the job variables a user of
    the stack gives: the local cloud the worker reaches and the bucket for checkpoints."""
    argv, env = stack.resolved["prefect-worker"]
    pool = argv[argv.index("--pool") + 1]
    job_variables = {
        "provider": "local",
        "provider_options": {"url": env["SPOT_LOCAL_CLOUD_URL"],
                             "workdir": env["SPOT_LOCAL_CLOUD_WORKDIR"]},
        "checkpoint_root": env["SPOT_CHECKPOINT_ROOT"] + "/prefect",
        "capacity_wait": 0.5,
        "max_preemptions": 1,  # then on-demand: preemptions are tested elsewhere
    }
    parameters = {"workdir": str(tmp / "prefect-work"), "steps": 400, "step_seconds": 0.01}
    python = image_env("spot-pipelines-prefect:latest") / "python"
    return subprocess.Popen(
        [str(python), str(Path(__file__).with_name("prefect_run.py")), pool,
         str(REPO / "flows"), json.dumps(job_variables), json.dumps(parameters),
         str(RUN_TIMEOUT)],
        env={**env, "PREFECT_LOGGING_LEVEL": "WARNING"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp)


def _bucket_keys(stack: Stack, prefix: str) -> list[str]:
    import boto3

    _, env = stack.resolved["object-store-init"]
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"],
                      region_name=env["AWS_DEFAULT_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    listed = s3.list_objects_v2(Bucket=env["SPOT_CHECKPOINT_BUCKET"], Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", [])]


def test_a_spot_dag_and_a_spot_flow_run_to_success_on_the_stack(stack, tmp_path):
    began = time.monotonic()
    prefect = _start_prefect_run(stack, tmp_path)
    try:
        api = AirflowApi(stack.url("airflow-api-server", 8080))
        api.wait_for_dag(DAG_ID, timeout=180)
        api.call("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
        run = api.call("POST", f"/dags/{DAG_ID}/dagRuns",
                       {"logical_date": None, "conf": {"steps": 300}})
        run_id = run["dag_run_id"]
        deadline = time.monotonic() + RUN_TIMEOUT
        while run["state"] not in ("success", "failed") and time.monotonic() < deadline:
            time.sleep(2)
            run = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        task = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train")
        logs = "\n".join(f"--- {name}\n{stack.log(name)[-1500:]}" for name in
                         ("airflow-scheduler", "airflow-triggerer", "spot-cloud"))
        assert run["state"] == "success", f"{run}\n{task}\n{describe(stack)}\n{logs}"
        assert task["try_number"] == 1  # preemptions, if any, spent no Airflow try
        keys = _bucket_keys(stack, f"airflow/{DAG_ID}/{run_id}/")
        assert keys, "no checkpoint of the DAG run in the stack's bucket"

        print(f"DAG run done at {time.monotonic() - began:.0f} s")
        out, err = prefect.communicate(timeout=RUN_TIMEOUT + 150)
        print(f"flow run done at {time.monotonic() - began:.0f} s: {out.strip()[-600:]}")
    finally:
        if prefect.poll() is None:
            prefect.kill()
            prefect.wait(timeout=10)
    assert prefect.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"] == "COMPLETED", (
        f"{result}\n{err[-2000:]}\n--- prefect-worker\n{stack.log('prefect-worker')[-3000:]}")
    assert _bucket_keys(stack, "prefect/"), "no checkpoint of the flow run in the bucket"
    # Both engines kept their state in the stack's PostgreSQL.
    assert _sql(stack, "airflow", f"SELECT state FROM dag_run WHERE run_id = '{run_id}'") \
        == "success"
    assert _sql(stack, "prefect", "SELECT state_type FROM flow_run WHERE id = "
                f"'{result['flow_run_id']}'") == "COMPLETED"


def _sql(stack: Stack, database: str, query: str) -> str:
    """One value from a database of the stack's PostgreSQL, as its superuser."""
    from urllib.parse import quote

    from postgres_helpers import psql

    env = stack.services["postgres"].environment
    url = (f"postgresql://{quote(env['POSTGRES_USER'])}:"
           f"{quote(env['POSTGRES_PASSWORD'], safe='')}@127.0.0.1:"
           f"{stack.ports[('postgres', 5432)]}/{database}")
    return psql(url, "-c", query).strip()
