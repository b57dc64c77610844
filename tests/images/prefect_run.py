"""Deploy the example flow to the stack's spot work pool and run it to the end (run in a
container of the stack's prefect-worker service, whose PREFECT_API_URL is the stack's
server; test_compose_stack.py mounts this file there).

    python prefect_run.py POOL FLOWS_DIR JOB_VARIABLES_JSON PARAMETERS_JSON TIMEOUT

Prints one JSON line: the flow run's final state and the names of the states it went
through.
"""

from __future__ import annotations

import json
import sys
import time

from prefect import flow, get_client
from prefect.deployments import run_deployment


def wait_for_pool(pool: str, timeout: float) -> None:
    """The worker creates its pool when it starts (`prefect worker start --type spot`)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            try:
                assert client.read_work_pool(pool).type == "spot"
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)


def main(pool: str, flows: str, job_variables: str, parameters: str, timeout: str) -> int:
    wait_for_pool(pool, 120)
    deployable = flow.from_source(
        source=flows, entrypoint="spot_ml_pipeline.py:spot_ml_pipeline_on_worker"
    )
    deployment_id = deployable.deploy(
        name="stack",
        work_pool_name=pool,
        job_variables=json.loads(job_variables),
        build=False,
        push=False,
        print_next_steps=False,
    )
    run = run_deployment(deployment_id, timeout=0, parameters=json.loads(parameters))
    deadline = time.monotonic() + float(timeout)
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            run = client.read_flow_run(run.id)
            if run.state is not None and run.state.is_final() and not run.state.is_crashed():
                break
            time.sleep(1)
        states = [state.name for state in client.read_flow_run_states(run.id)]
    print(
        json.dumps(
            {
                "state": run.state.type.value if run.state else None,
                "states": states,
                "flow_run_id": str(run.id),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
