"""A flow run on a ``spot`` work pool whose job variables name provider ``acme`` (a
package's new name for a built-in provider), run by ``prefect worker start --type spot``
against a real Prefect server (tests/support/prefect_stack.py, as the Prefect tests start it);
prints the pool form's provider choices, the flow run's final state and the record's
attempts as one JSON line. Run by tests/core/test_provider_plugins.py in a clean
environment holding only the wheels (and the tests' helpers, tests.support, on its path)."""

import json
import sys
import time
from pathlib import Path

from tests.support.prefect_stack import deploy_example_flow, prefect_server, running_worker

FLOW = """
from prefect import flow


@flow
def plugin_check() -> int:
    return 42
"""


def main(workdir: Path) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_spot.artifacts import load_record, record_key
    from prefect_spot.workers import SpotWorker

    (workdir / "flows").mkdir(parents=True)
    (workdir / "flows" / "plugin_check.py").write_text(FLOW)
    variables = {
        "provider": "acme",
        "checkpoint_root": (workdir / "ckpt").as_uri(),
        "provider_options": {"time_scale": 60.0},
        "poll_interval": 0.2,
    }
    with prefect_server(workdir / "home") as api, temporary_settings({PREFECT_API_URL: api}):
        deployment = deploy_example_flow(
            "acme-pool",
            "acme",
            variables,
            source=workdir / "flows",
            entrypoint="plugin_check.py:plugin_check",
        )
        run = run_deployment(deployment, timeout=0)
        with (
            running_worker("acme-pool", workdir / "worker.log"),
            get_client(sync_client=True) as client,
        ):
            deadline, record = time.monotonic() + 240, None
            while time.monotonic() < deadline:  # the run ends, then the worker's record
                state = client.read_flow_run(run.id).state
                record = load_record(record_key(run.id))
                if (
                    state is not None
                    and state.is_final()
                    and record is not None
                    and record.status.value != "running"
                ):
                    break
                time.sleep(1)
    template = SpotWorker.get_default_base_job_template()
    print(
        json.dumps(
            {
                "enum": template["variables"]["properties"]["provider"]["enum"],
                "state": state.type.value,
                "attempts": [str(a.outcome) for a in record.attempts] if record else None,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
