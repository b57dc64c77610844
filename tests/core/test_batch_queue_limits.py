"""The work queue's limits and forged objects, as a user of the queue and its worker sees them.

What cannot be read back is refused when written, in one line, with nothing written: a
spec too big to open, a second spec at a queue's URI, a unit's output over the output
limit or not JSON at all (NaN, a set), which spends one of the unit's retries. What is
read is checked: a forged unit object (garbage, an unknown field, a wrong type, an unknown
state, a time that is not finite) is one warning line, counted as failed and never run or
written over, so the queue still completes; a forged spec is one line when the queue is
opened. Each runs on a file store and on S3 (moto in server mode), through the real
``python -m spot_core.workloads.batch_worker`` where the worker is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from spot_core.checkpoint import open_store
from spot_core.errors import ConfigError
from spot_core.workloads.batch import (
    DONE,
    FAILED,
    SPEC_KEY,
    ItemRange,
    Manifest,
    WorkQueue,
    output_key,
)
from tests.support.aws_helpers import client, unique

pytestmark = pytest.mark.timeout(300)

FUNCTIONS = """
    import math

    def huge(item):  # one unit's output over the 64 MiB limit
        return "x" * (65 << 20) if item == 1 else item

    def nan(item):
        return math.nan if item == 1 else item

    def a_set(item):
        return {item} if item == 1 else item

    def same(item):
        return item
"""


@pytest.fixture(params=["file", "s3"])
def uri(request, tmp_path):
    if request.param == "file":
        return (tmp_path / "queue").as_uri()
    aws_env = request.getfixturevalue("aws_env")
    bucket = unique("batch-limits")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/batches/b1"


@pytest.fixture
def functions(tmp_path) -> str:
    """A module of user functions the worker command imports (``batch_user:NAME``)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "batch_user.py").write_text(textwrap.dedent(FUNCTIONS))
    return str(folder)


def worker(uri: str, function: str, path: str, *extra: str) -> subprocess.CompletedProcess:
    """The real batch worker command, as a spot step runs it."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "spot_core.workloads.batch_worker", "--queue", uri]
    command += ["--function", f"batch_user:{function}", "--worker-id", "w1"]
    command += ["--idle-timeout-seconds", "30", *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def stored(uri: str, key: str) -> bytes | None:
    """The bytes under ``key`` in the queue's store, whatever their size; None if absent."""
    try:
        return open_store(uri).backend.get_bytes(key)
    except FileNotFoundError:
        return None


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# -- limits at write -----------------------------------------------------------------------------
def test_a_spec_too_big_to_read_back_is_refused_at_create_with_nothing_written(uri):
    uris = tuple(f"s3://inputs/images/2026/12/07/camera-{i:09d}.jpg" for i in range(400_000))
    with pytest.raises(ConfigError) as refused:
        WorkQueue.create(uri, Manifest(uris), unit_size=50)
    line = one_line(refused)
    assert "16.0 MiB" in line and "400,000 items" in line and "split the batch" in line
    assert stored(uri, SPEC_KEY) is None  # nothing written
    with pytest.raises(ConfigError, match="no work queue"):
        WorkQueue.open(uri)
    WorkQueue.create(uri, Manifest(uris[:1000]), unit_size=50)  # the URI is still free
    assert WorkQueue.open(uri).spec.units == 20


def test_a_create_never_replaces_a_spec_even_one_it_cannot_read(uri):
    WorkQueue.create(uri, ItemRange(0, 10), unit_size=2)
    WorkQueue.create(uri, ItemRange(0, 10), unit_size=2)  # the same spec: the same queue
    with pytest.raises(ConfigError, match="already holds another queue"):
        WorkQueue.create(uri, ItemRange(0, 11), unit_size=2)
    assert WorkQueue.open(uri).spec.items == ItemRange(0, 10)  # the first spec intact

    # a spec over the read limit (an older version wrote them): an error, never "absent"
    other = uri.rstrip("/") + "-big"
    big = b'{"format": 1, "items": {"manifest": ["' + b"u" * (16 << 20) + b'"]}}'
    open_store(other).put_object(SPEC_KEY, big)
    with pytest.raises(ConfigError) as unreadable:
        WorkQueue.open(other)
    assert "cannot be read" in one_line(unreadable) and "16.0 MiB" in str(unreadable.value)
    with pytest.raises(ConfigError) as refused:
        WorkQueue.create(other, ItemRange(0, 4), unit_size=2)
    assert "cannot be read" in one_line(refused)
    assert stored(other, SPEC_KEY) == big  # not replaced


@pytest.mark.parametrize(
    ("function", "problem", "extra"),
    [
        ("huge", "over the 64.0 MiB", ()),
        ("nan", "Out of range float values are not JSON compliant", ()),
        ("a_set", "Object of type set is not JSON serializable", ()),
        (
            "nan",
            "Out of range float values are not JSON compliant",
            ("--checkpoint-every-items", "1"),
        ),
    ],
    ids=["over-limit", "nan", "set", "nan-checkpointed"],
)
def test_an_output_that_cannot_be_stored_spends_the_units_retries(
    uri, functions, function, problem, extra
):
    queue = WorkQueue.create(uri, ItemRange(0, 3), unit_size=1, max_unit_retries=1)
    run = worker(uri, function, functions, *extra)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if "unit-000001" in line]
    assert len(lines) == 2 and all(problem in line for line in lines), run.stderr[-3000:]
    states = {s.unit: s for s in queue.states()}
    failed = states["unit-000001"]
    assert failed.state == FAILED and failed.failures == 2  # one retry spent per claim
    assert problem in failed.errors[-1]
    assert [states[u].state for u in ("unit-000000", "unit-000002")] == [DONE, DONE]
    for claim in (1, 2):  # nothing of it was stored: never done, never "missing or altered"
        assert stored(uri, output_key("unit-000001", claim)) is None
    assert dict(queue.outputs()) == {"unit-000000": [0], "unit-000002": [2]}
    assert queue.progress().complete and queue.progress().failed == 1


# -- every object checked when read --------------------------------------------------------------
def unit_doc(**fields) -> bytes:
    doc = {
        "unit": "unit-000002",
        "state": "claimed",
        "claim": 1,
        "owner": "w0",
        "token": "0123abcd",
        "heartbeat_at": 1.0,
        "failures": 0,
        "errors": [],
        "output_key": "",
        "output_sha256": "",
    }
    return json.dumps({**doc, **fields}).encode()


FORGED = {
    "garbage": b"\x00\xff not json at all",
    "not-an-object": b"[1, 2, 3]",
    "unknown-field": unit_doc(lease="x"),
    "wrong-type": unit_doc(claim="3"),
    "unknown-state": unit_doc(state="running"),
    "nan-heartbeat": unit_doc(heartbeat_at=float("nan")),
    "other-unit": unit_doc(unit="unit-000001"),
    "done-elsewhere": unit_doc(state="done", output_key="../../etc/passwd", output_sha256="0" * 64),
    "too-big": b" " * (2 << 20) + unit_doc(),
}


@pytest.mark.parametrize("forged", FORGED, ids=list(FORGED))
def test_a_forged_unit_object_is_one_line_and_the_queue_completes(uri, functions, forged):
    queue = WorkQueue.create(uri, ItemRange(0, 4), unit_size=1)
    key = "queue/units/unit-000002.json"
    open_store(uri).put_object(key, FORGED[forged])
    progress = queue.progress()
    assert (progress.pending, progress.failed, progress.corrupt) == (3, 1, 1)

    run = worker(uri, "same", functions)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if "unit-000002" in line]
    assert len(said) == 1 and "corrupt" in said[0] and "remove" in said[0], run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["units_done"] == 3
    progress = queue.progress()
    assert progress.complete and (progress.done, progress.failed, progress.corrupt) == (3, 1, 1)
    assert stored(uri, key) == FORGED[forged]  # untouched
    assert [unit for unit, _ in queue.outputs()] == ["unit-000000", "unit-000001", "unit-000003"]

    if forged != "garbage":
        return  # the rest once: removing the object, as the line says, runs the unit again
    open_store(uri).delete_object(key)
    assert worker(uri, "same", functions).returncode == 0
    assert dict(queue.outputs())["unit-000002"] == [2] and queue.progress().corrupt == 0


SPECS = {
    "garbage": b"\x00\xff not json",
    "a-list": b"[]",
    "unknown-field": b'{"format": 1, "items": {"range": [0, 4]}, "unit_size": 1, '
    b'"claim_timeout_seconds": 60, "max_unit_retries": 2, "priority": 9}',
    "wrong-type": b'{"format": 1, "items": {"range": [0, "4"]}, "unit_size": 1, '
    b'"claim_timeout_seconds": 60, "max_unit_retries": 2}',
    "out-of-range": b'{"format": 1, "items": {"range": [0, 4]}, "unit_size": 0, '
    b'"claim_timeout_seconds": 60, "max_unit_retries": 2}',
    "infinite-timeout": b'{"format": 1, "items": {"range": [0, 4]}, "unit_size": 1, '
    b'"claim_timeout_seconds": Infinity, "max_unit_retries": 2}',
    "newer-format": b'{"format": 2, "items": {"range": [0, 4]}, "unit_size": 1, '
    b'"claim_timeout_seconds": 60, "max_unit_retries": 2}',
}


@pytest.mark.parametrize("forged", SPECS, ids=list(SPECS))
def test_a_forged_spec_is_one_line_when_the_queue_is_opened(uri, functions, forged):
    open_store(uri).put_object(SPEC_KEY, SPECS[forged])
    with pytest.raises(ConfigError) as refused:
        WorkQueue.open(uri)
    assert "cannot be read" in one_line(refused) and "another queue URI" in str(refused.value)
    run = worker(uri, "same", functions)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(run.stderr.strip().splitlines()) == 1 and "cannot be read" in run.stderr
