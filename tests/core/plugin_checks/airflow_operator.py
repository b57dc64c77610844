"""SpotJobOperator on provider ``acme`` (a package's new name for a built-in provider),
deferred to its SpotJobTrigger and back, as Airflow runs it; prints the JobRecord's
summary and the trigger's provider as one JSON line. Run by
tests/core/test_provider_plugins.py in a clean environment holding only the wheels (and
the Airflow tests' ``task_context`` helper on its path)."""

import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.operators.spot import SpotJobOperator
from tests.support.task_context import TI, StateStore, first_event


def main(workdir: Path) -> None:
    with DAG("plugin_check", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="train",
            provider="acme",
            deferrable=True,
            command=[sys.executable, "-c", "import time; time.sleep(1)"],
            checkpoint_uri=(workdir / "ckpt").as_uri(),
            poll_interval=0.2,
            provider_options={"workdir": str(workdir / "cloud")},
        )
    context, providers = {"ti": TI(), "task_state_store": StateStore()}, []
    try:
        summary = op.execute(context)
    except TaskDeferred as deferred:
        pending = deferred
        for _ in range(20):
            providers.append(pending.trigger.provider)
            payload = asyncio.run(asyncio.wait_for(first_event(pending.trigger), 120))
            try:
                summary = getattr(op, pending.method_name)(context, payload)
                break
            except TaskDeferred as again:
                pending = again
    print(json.dumps({"summary": summary, "trigger_providers": providers}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
