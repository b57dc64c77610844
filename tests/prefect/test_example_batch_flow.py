"""The batch inference example flow on a real Prefect server: workers mapped over one
queue on the local spot cloud, reclaimed on the way; every unit done once, a progress
artifact at 100 % and a table of the queue's units."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

FLOW_FILE = Path(__file__).resolve().parents[2] / "flows" / "spot_batch_inference.py"


def load_flow():
    if "spot_batch_inference" not in sys.modules:
        spec = importlib.util.spec_from_file_location("spot_batch_inference", FLOW_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["spot_batch_inference"] = module
        spec.loader.exec_module(module)
    return sys.modules["spot_batch_inference"]


@pytest.mark.timeout(600)
def test_batch_flow_finishes_every_unit_once_through_reclaims(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from spot_core.workloads.batch import WorkQueue, outputs_sha256
    from spot_core.workloads.batch_inference import infer

    flows = load_flow()
    state = flows.spot_batch_inference(
        workdir=str(tmp_path), items=300, unit_size=10, return_state=True
    )
    assert state.is_completed(), state
    result = state.result()
    assert result["complete"] and result["done"] == 30 and result["failed"] == 0
    queue = WorkQueue.open((tmp_path / "queue").as_uri())
    items = sorted(o["item"] for _, outs in queue.outputs() for o in outs)
    assert items == list(range(300))
    plain = [(u, [infer(i) for i in queue.spec.unit_items(u)]) for u in queue.spec.unit_ids()]
    assert result["outputs_sha256"] == outputs_sha256(plain)
    assert result["preemptions"] >= 1  # the trace reclaimed workers on the way

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    # the queue's progress and table, beside the spot jobs' own progress and attempts
    [progress] = [a for a in artifacts if a.description == "units of the batch done"]
    assert progress.type == "progress" and progress.data == 100.0
    [table] = [a for a in artifacts if a.type == "table" and a.description.startswith("work")]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert rows[0]["done"] == 30
