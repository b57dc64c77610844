"""Saves in the background (``Checkpointer(background=True)``) and the fast restore.

What the user cares about: the loop goes on while its state uploads, and what lands is
the state as it was handed over (not as the loop changed it after); an interruption still
lands the newest state; a background save that fails is one clear error at the next
``maybe_save`` and never counts as committed; a restore read in ranges at once gives the
same bytes as one read whole, and is whole-checked like it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import Checkpointer, open_store
from spot_core.checkpoint.fetch import RANGE_BYTES, RANGE_THRESHOLD_BYTES
from spot_core.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpoint,
    Preempted,
)
from tests.support.aws_helpers import client, unique
from tests.support.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20


@pytest.fixture
def bucket(aws_env) -> str:
    name = unique("background")
    client("s3", aws_env).create_bucket(Bucket=name)
    return name


def test_a_background_save_lands_the_state_as_handed_over(tmp_path: Path) -> None:
    """The loop writes into its state right after each hand-over; every checkpoint holds
    the state of its own step, and the loop never waited for an upload."""
    store = open_store((tmp_path / "store").as_uri())
    ckpt = Checkpointer(store, every_steps=3, keep=10, background=True)
    state = bytearray(2 * MiB)
    for step in range(1, 16):
        state[:8] = step.to_bytes(8, "big")  # the loop changes its state every step
        assert ckpt.maybe_save(step, lambda: {"state": state}) is None  # never waits
    ckpt.close()  # waits for the one in flight
    saved = {ref.step: store.load(ref)["state"][:8] for ref in store.list()}
    assert saved and all(int.from_bytes(head, "big") == step for step, head in saved.items())
    assert ckpt.last_ref is not None and ckpt.last_ref.step == max(saved)
    assert ckpt.saves == len(saved) and ckpt.last_stall_seconds < ckpt.last_upload_seconds


def test_a_path_payload_is_refused_in_one_line_for_a_background_save(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    ckpt = Checkpointer(store, every_steps=1, background=True)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x")
    with pytest.raises(ConfigError, match="cannot stage.*background=False"):
        ckpt.maybe_save(1, lambda: {"w": str(weights)})
    assert store.list() == []


def test_an_emergency_save_waits_for_the_one_in_flight_then_lands_the_newest(bucket) -> None:
    """A notice while a background save uploads: the loop stops with the newest state
    committed (the one in flight committed too, under it), within the notice."""
    store = open_store(f"s3://{bucket}/jobs/notice")
    ckpt = Checkpointer(store, every_steps=1, keep=10, background=True)
    state = bytearray(24 * MiB)
    ckpt.maybe_save(1, lambda: {"state": bytes(state)})
    assert ckpt._inflight is not None, "the first save is still uploading"
    ckpt.request_emergency_save("spot interruption notice")
    started = time.monotonic()
    state[:1] = b"\x02"
    with pytest.raises(Preempted, match="state saved at step 2"):
        ckpt.maybe_save(2, lambda: {"state": bytes(state)})
    assert time.monotonic() - started < 120, "inside AWS's two-minute notice"
    latest = store.latest()
    assert (latest.step, latest.metadata["emergency"]) == (2, "spot interruption notice")
    assert store.load(latest)["state"][:1] == b"\x02"
    assert [r.step for r in store.list()] == [1, 2]


def test_a_failed_background_save_is_reported_at_the_next_maybe_save_not_committed(
    aws_env, bucket
) -> None:
    """S3 answers the upload's PUTs with 503 (a real fault, between boto3 and moto): the
    next ``maybe_save`` raises one clear, retryable store error naming the step, and the
    store's newest checkpoint is still the one before it."""
    uri = f"s3://{bucket}/jobs/failing"
    with FaultProxy(aws_env, match="/checkpoints/", methods=("PUT", "POST")) as proxy:
        store = open_store(uri, endpoint_url=proxy.url, call_deadline_seconds=3)
        ckpt = Checkpointer(store, every_steps=1, keep=10, background=True)
        ckpt.maybe_save(1, lambda: {"state": b"1" * 1000})
        assert ckpt.wait_for_save().step == 1
        proxy.mode = "503"
        ckpt.maybe_save(2, lambda: {"state": b"2" * 1000})
        deadline = time.monotonic() + 60
        while not ckpt._inflight.done and time.monotonic() < deadline:
            time.sleep(0.05)  # the loop works on meanwhile; nothing is raised mid-step
        with pytest.raises(CheckpointError) as caught:
            ckpt.maybe_save(3, lambda: {"state": b"3" * 1000})
        assert proxy.failed
        message = str(caught.value)
        assert [r.step for r in open_store(uri).list()] == [1]
        assert ckpt.last_ref.step == 1 and ckpt.saves == 1, "the failed save never counted"
        proxy.mode = None  # S3 answers again: the next save goes through
        assert ckpt.maybe_save(3, lambda: {"state": b"3" * 1000}) is None  # reported once
        assert ckpt.wait_for_save().step == 3
    assert message.startswith("the background checkpoint save of step 2 to " + uri), message
    assert "nothing of it was committed" in message and "is step 1" in message, message
    assert caught.value.retryable and "\n" not in message
    assert open_store(uri).load(open_store(uri).latest()) == {"state": b"3" * 1000}


LOOP = """
import sys, time
from spot_core.checkpoint import Checkpointer
from spot_core.errors import Preempted

ckpt = Checkpointer.from_env(every_steps=1, keep=100, background=True).attach_signals()
state = bytearray(int(sys.argv[1]))
print("ready", flush=True)
try:
    for step in range(1, 100000):
        state[:8] = step.to_bytes(8, "big")
        time.sleep(0.01)
        ckpt.maybe_save(step, lambda: {"state": state})
except Preempted as exc:
    print(f"preempted {exc} skipped={ckpt.skipped_saves}", flush=True)
    sys.exit(3)
"""


def test_an_async_save_interrupted_by_sigterm_still_lands_the_newest_state(tmp_path):
    """A real training loop saving in the background every step (each upload longer than
    a step, so one is in flight when the SIGTERM comes): it stops with the state of the
    step it stopped at committed, and ``latest()`` returns exactly that."""
    uri = (tmp_path / "store").as_uri()
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOP, str(32 * MiB)],
        env={**os.environ, "SPOT_CHECKPOINT_URI": uri, "SPOT_ATTEMPT": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    stopped = int(re.search(r"state saved at step (\d+)", out).group(1))
    assert int(re.search(r"skipped=(\d+)", out).group(1)) > 0, "saves were in flight"
    store = open_store(uri)
    latest = store.latest()
    assert (latest.step, latest.metadata["emergency"]) == (stopped, "received SIGTERM")
    assert int.from_bytes(store.load(latest)["state"][:8], "big") == stopped


# -- fast restore ---------------------------------------------------------------------------
def _payload() -> dict[str, bytes]:
    big = RANGE_THRESHOLD_BYTES + RANGE_BYTES // 2 + 7  # ranges, the last one short
    return {
        "model.bin": os.urandom(big),
        "optim/state.bin": os.urandom(3 * MiB),
        "meta.json": json.dumps({"epoch": 3}).encode(),
    }


def test_a_ranged_concurrent_restore_equals_a_whole_read(bucket) -> None:
    """S3: the large file read in ranges at once, the rest whole, digests checked; the
    bytes equal the payload and a one-thread read of each file whole."""
    store = open_store(f"s3://{bucket}/jobs/restore")
    payload = _payload()
    ref = store.save(1, payload)
    assert store.load(ref) == payload
    assert store.load(ref, workers=1) == payload
    assert store.load_concurrently(ref) == payload


def test_a_ranged_restore_reads_a_cut_range_again_and_rejects_a_changed_object(
    aws_env, bucket
) -> None:
    uri = f"s3://{bucket}/jobs/cut"
    store = open_store(uri)
    payload = _payload()
    ref = store.save(1, payload)
    with FaultProxy(aws_env, match="model.bin", methods=("GET",), times=2) as proxy:
        proxy.mode = "cut"  # two ranges cut half-way: each is read again
        assert open_store(uri, endpoint_url=proxy.url).load(ref) == payload
        assert proxy.failed == 2
    key = f"jobs/cut/checkpoints/{ref.checkpoint_id}/model.bin"
    changed = bytearray(payload["model.bin"])
    changed[RANGE_BYTES + 1] ^= 0xFF  # one byte inside the second range
    client("s3", aws_env).put_object(Bucket=bucket, Key=key, Body=bytes(changed))
    with pytest.raises(CorruptCheckpoint, match="'model.bin' fails its blake3 check"):
        store.load(ref)
    assert store.latest() is None  # nothing else to fall back to


def test_a_background_torch_save_restores_the_same_tensors_as_a_foreground_one(tmp_path):
    """Tensors staged by a clone and serialised in the background restore equal to a
    foreground save of the same state, though the loop changed them after the hand-over."""
    torch = pytest.importorskip("torch")
    from spot_core.checkpoint.torch_state import restore_torch, staged_torch_payload

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    stores = {how: open_store((tmp_path / how).as_uri()) for how in ("sync", "async")}
    Checkpointer(stores["sync"]).save_now(1, lambda: staged_torch_payload(model, optimizer))
    ckpt = Checkpointer(stores["async"], every_steps=1, background=True)
    assert ckpt.maybe_save(1, lambda: staged_torch_payload(model, optimizer)) is None
    with torch.no_grad():
        model.weight.add_(1.0)  # the loop goes on at once
    ckpt.close()
    for how, store in stores.items():
        twin = torch.nn.Linear(64, 32)
        restore_torch(store.load(store.latest()), twin, torch.optim.SGD(twin.parameters(), lr=1))
        for name, tensor in twin.state_dict().items():
            assert torch.equal(tensor, expected[name]), (how, name)
