"""PyTorch Distributed Checkpoint through the store, with real torch.distributed (gloo, CPU).

Each rank is its own process (tests/support/dcp_rank.py), as on a multi-node job. What a
user relies on: a version saved at 4 ranks loads at 2 and at 1 with equal tensors (on a
file and an S3 store); a rank killed mid-save leaves the previous version restorable and
the torn one is never returned; a zombie attempt fenced during its save commits nothing;
``dcp.async_save`` commits like ``dcp.save``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.aws_helpers import client, unique

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from spot_core.checkpoint import open_store  # noqa: E402
from spot_core.checkpoint.torch_dcp import StoreReader, StoreWriter  # noqa: E402

pytestmark = pytest.mark.timeout(240)
from tests.support import SUPPORT  # noqa: E402
from tests.support.dcp_rank import full_state  # noqa: E402

RANK_SECONDS = 120


def run_phases(*phases):
    """Each phase ``(world, mode, uri, step, out[, attempt])`` run in turn, its ranks each
    their own process (forked by dcp_rank.py's launcher from one import of torch); per
    phase, each rank's (report, or None if it died; exit code)."""
    argv = [json.dumps([w, m, u, s, a[0] if a else 1, str(o)]) for w, m, u, s, o, *a in phases]
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "dcp_rank.py"), *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=RANK_SECONDS * len(phases),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert lines, f"the launcher failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return [[(r["report"], r["exitcode"]) for r in phase] for phase in json.loads(lines[-1])]


def run_ranks(world: int, mode: str, uri: str, step: int, out: Path, attempt: int = 1):
    [results] = run_phases((world, mode, uri, step, out, attempt))
    return results


def assert_all_ok(results):
    for report, code in results:
        assert report is not None and report["ok"], (report, code)


def assert_equal_state(path: Path, step: int):
    loaded = torch.load(path, weights_only=True)
    expected = full_state(step)
    assert torch.equal(loaded["w"], expected["w"])
    assert torch.equal(loaded["b"], expected["b"])
    assert loaded["meta"] == {"step": step}


def save_in_process(store, step: int, attempt: int = 1):
    """A version saved by one process (DCP without a process group)."""
    writer = StoreWriter(store, step, attempt=attempt)
    dcp.save(full_state(step), storage_writer=writer, no_dist=True)
    return writer.ref


def load_in_process(store, ref=None) -> dict:
    state = {"w": torch.zeros(16, 4), "b": torch.zeros(4), "meta": {"step": -1}}
    dcp.load(state, storage_reader=StoreReader(store, ref), no_dist=True)
    return state


@pytest.fixture
def s3_uri(aws_env):
    name = unique("dcp")
    client("s3", aws_env).create_bucket(Bucket=name)
    return f"s3://{name}/jobs/dcp"


@pytest.mark.parametrize("where", ["file", "s3"])
def test_saved_at_4_ranks_loads_at_2_and_at_1(where, tmp_path, request):
    uri = f"file://{tmp_path}/store" if where == "file" else request.getfixturevalue("s3_uri")
    saved, loaded = run_phases((4, "save", uri, 30, "-"), (2, "load", uri, 0, tmp_path / "at2.pt"))
    assert_all_ok(saved)
    assert_all_ok(loaded)
    store = open_store(uri)
    ref = store.latest()
    assert ref is not None and ref.step == 30 and ref.checkpoint_id == saved[0][0]["committed"]
    assert ref.metadata["world_size"] == 4
    parts = set(store.load(ref))
    assert parts == {".metadata", *(f"__{rank}_0.distcp" for rank in range(4))}

    assert_equal_state(tmp_path / "at2.pt", 30)
    state = load_in_process(store)
    assert torch.equal(state["w"], full_state(30)["w"]) and state["meta"] == {"step": 30}


def test_a_rank_killed_mid_save_leaves_the_previous_version(tmp_path):
    uri = f"file://{tmp_path}/store"
    store = open_store(uri)
    previous = save_in_process(store, 10)

    results = run_ranks(4, "save_die", uri, 20, tmp_path / "unused")
    assert results[2][0] is None and results[2][1] == -9  # the victim died by SIGKILL
    assert not any(report and report["ok"] for report, _ in results)

    assert store.latest() == previous
    assert [r.checkpoint_id for r in store.list()] == [previous.checkpoint_id]
    torn = [
        p.name
        for p in (tmp_path / "store" / "checkpoints").iterdir()
        if "step-000000000020" in p.name
    ]
    assert torn, "the torn version's parts are where a later prune finds them"
    state = load_in_process(store)
    assert torch.equal(state["w"], full_state(10)["w"])

    save_in_process(store, 30)  # the next commit; its prune removes the torn parts
    store.prune(keep=3)
    assert not [p for p in (tmp_path / "store" / "checkpoints").iterdir() if p.name in torn]


def test_a_zombie_fenced_during_its_save_commits_nothing(tmp_path):
    uri = f"file://{tmp_path}/store"
    store = open_store(uri)
    previous = save_in_process(store, 10)

    results = run_ranks(2, "save_fenced", uri, 20, tmp_path / "unused", attempt=1)
    for report, code in results:
        assert report is not None and not report["ok"], (report, code)
        assert "FencedOut" in report["error"] or "attempt 2" in report["error"]
    assert store.latest() == previous
    assert store.fence_level() == 2
    folders = [p.name for p in (tmp_path / "store" / "checkpoints").iterdir()]
    assert folders == [previous.checkpoint_id]  # the refused version's parts are gone

    results = run_ranks(2, "save", uri, 20, tmp_path / "unused", attempt=1)  # after handover
    assert not any(report["ok"] for report, _ in results)
    assert store.latest() == previous


def test_async_save_commits_a_version(tmp_path):
    uri = f"file://{tmp_path}/store"
    assert_all_ok(run_ranks(2, "async_save", uri, 40, tmp_path / "unused"))
    store = open_store(uri)
    ref = store.latest()
    assert ref is not None and ref.step == 40
    state = load_in_process(store, ref)
    assert torch.equal(state["w"], full_state(40)["w"])
    assert torch.equal(state["b"], full_state(40)["b"])
