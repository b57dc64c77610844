"""What a reclaim cost in wall time: each resumed attempt's ``resumed_at`` (reported by the
step's Checkpointer through the store) and the ``time_to_resume_seconds`` the record derives
from the previous attempt's notice; old records without either still load."""

from __future__ import annotations

import json
import time

import pytest

from spot_core.checkpoint import Checkpointer, open_store
from spot_core.checkpoint.resumed import read_resumed, resumed_key
from spot_core.controller import Controller, JobSpec
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Attempt, JobRecord, Outcome, Pool
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from spot_core.report.rows import attempt_cells, ledger_lines
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")


def _history(*, notice_at: float | None = 1100.0, resumed_at: float | None = 1130.0) -> JobRecord:
    """Attempt 1 preempted (notice at 1100, ended 1120), a capacity miss, attempt 3 resumed."""
    record = JobRecord("train", 0.0)
    record = record.start_attempt(Attempt(1, SPOT, 1000.0, lease_id="i-1"))
    record = record.finish_attempt(
        Attempt(
            1,
            SPOT,
            1000.0,
            lease_id="i-1",
            ended_at=1120.0,
            outcome=Outcome.PREEMPTED,
            notice_at=notice_at,
            checkpoint_step_end=40,
        )
    )
    record = record.start_attempt(Attempt(2, SPOT, 1121.0))
    record = record.finish_attempt(
        Attempt(2, SPOT, 1121.0, ended_at=1121.0, outcome=Outcome.CAPACITY_UNAVAILABLE)
    )
    record = record.start_attempt(Attempt(3, SPOT, 1122.0, lease_id="i-3"))
    return record.finish_attempt(
        Attempt(
            3,
            SPOT,
            1122.0,
            lease_id="i-3",
            ended_at=1200.0,
            outcome=Outcome.SUCCEEDED,
            checkpoint_step_start=40,
            resumed_at=resumed_at,
        )
    )


def test_time_to_resume_runs_from_the_notice_across_capacity_misses():
    record = _history()
    assert record.time_to_resume_seconds == [30.0]
    assert record.time_to_resume(record.attempts[0]) is None  # a first attempt resumes nothing
    assert record.summary()["time_to_resume_seconds"] == [30.0]


def test_without_a_notice_time_to_resume_runs_from_the_old_attempts_end():
    assert _history(notice_at=None).time_to_resume_seconds == [10.0]


def test_the_record_round_trips_and_shows_time_to_resume_beside_each_attempt():
    record = _history()
    data = json.loads(record.to_json())
    assert data["attempts"][2]["time_to_resume_seconds"] == 30.0
    assert data["attempts"][2]["resumed_at"] == 1130.0
    assert "time_to_resume_seconds" not in data["attempts"][0]
    assert JobRecord.from_json(record.to_json()) == record


def test_a_record_written_before_resumed_at_existed_still_loads():
    data = json.loads(_history().to_json())
    for attempt in data["attempts"]:
        del attempt["resumed_at"]
        attempt.pop("time_to_resume_seconds", None)
    old = JobRecord.from_dict(data)
    assert old.attempts[2].resumed_at is None
    assert old.time_to_resume_seconds == []
    assert old.summary()["time_to_resume_seconds"] == []


def test_the_report_rows_and_ledger_show_the_time_to_resume():
    record = _history()
    # one unit per view: the job ran minutes, so its time to resume is in minutes too
    assert attempt_cells(record.attempts[2], record)[4] == "40 in 0.5 min"
    assert attempt_cells(record.attempts[2])[4] == "40"
    assert attempt_cells(record.attempts[0], record)[4] == "-"
    assert "resumed 1 time: from step 40 in 0.5 min" in ledger_lines(record)


def test_the_checkpointer_reports_its_first_step_once_through_the_store(tmp_path):
    store = open_store(tmp_path.as_uri())
    first = Checkpointer(store, attempt=1, every_steps=5)
    assert first.restore() is None
    first.maybe_save(1, lambda: {"w": b"1"})
    one = read_resumed(store, 1)
    assert one is not None and one.step is None  # a fresh start
    for step in range(2, 11):
        first.maybe_save(step, lambda: {"w": b"x"})
    assert read_resumed(store, 1) == one  # written once, at the first step

    before = time.time()
    second = Checkpointer(store, attempt=2, every_steps=5)
    assert second.restore() is not None
    assert read_resumed(store, 2) is None  # restored, but no step made yet
    second.maybe_save(11, lambda: {"w": b"y"})
    report = read_resumed(store, 2)
    assert report is not None and report.step == 10 and report.resumed_at >= before
    assert report.restore_seconds >= 0


def test_a_forged_resume_report_is_read_as_none(tmp_path):
    store = open_store(tmp_path.as_uri())
    store.put_object(resumed_key(2), b'{"attempt": 3, "resumed_at": 5.0}')
    assert read_resumed(store, 2) is None
    store.put_object(resumed_key(2), b'{"attempt": 2, "resumed_at": NaN}')
    assert read_resumed(store, 2) is None
    store.put_object(resumed_key(2), b"[not json")
    assert read_resumed(store, 2) is None


@pytest.mark.timeout(120)
def test_a_preempted_job_on_the_local_cloud_records_what_the_reclaim_cost(tmp_path):
    """Through the controller, as every driver runs it: the resumed attempt has the
    resumed_at its step reported, after the notice, and the record the time to resume."""
    pattern = "1" * 4 + "0" * 3 + "1" * 400
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", pattern)],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0),
    ) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            "job-ttr",
            train_command(steps=600, step_seconds=0.01),
            (tmp_path / "ckpt").as_uri(),
            provider.pools(),
        )
        controller = Controller(
            provider,
            provider.market,
            RetryPolicy(max_preemptions=3, capacity_wait_seconds=0.5, on_demand_fallback=False),
            heartbeat_timeout_seconds=None,
            poll_interval_seconds=0.05,
        )
        record = controller.run(spec)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert record.attempts[0].outcome is Outcome.PREEMPTED
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    resumed = [a for a in record.attempts if a.number > 1 and a.lease_id]
    notice = record.attempts[0].notice_at or record.attempts[0].ended_at
    assert resumed[0].resumed_at is not None and resumed[0].resumed_at > notice
    assert len(record.time_to_resume_seconds) == record.preemptions
    assert all(t > 0 for t in record.time_to_resume_seconds)


def test_a_step_without_a_checkpointer_records_no_resume(tmp_path):
    record = _history(resumed_at=None)
    assert record.time_to_resume_seconds == []


def test_the_timeline_keeps_a_short_attempts_step_labels_apart():
    """Today's bug: on an attempt a few pixels wide "from 330" and "ckpt 640" printed over
    each other. Every row's step labels must not overlap (checked by geometry here, and by
    eye in a headless-Chromium screenshot when the layout was made)."""
    import xml.etree.ElementTree as ET

    from spot_core.charts import attempt_timeline
    from spot_core.charts.timeline import label_width

    record = JobRecord("short", 0.0)
    spans = [(0, 3000, None, 330), (3010, 3060, 330, 640), (3070, 6000, 640, 1000)]
    for n, (start, end, first, last) in enumerate(spans, 1):
        record = record.start_attempt(Attempt(n, SPOT, start, lease_id=f"i-{n}"))
        record = record.finish_attempt(
            Attempt(
                n,
                SPOT,
                start,
                lease_id=f"i-{n}",
                ended_at=end,
                outcome=Outcome.PREEMPTED if n < 3 else Outcome.SUCCEEDED,
                checkpoint_step_start=first,
                checkpoint_step_end=last,
                notice_at=end - 5 if n < 3 else None,
                resumed_at=None if n == 1 else start + 4,
            )
        )
    svg = attempt_timeline(record)
    steps = [
        e
        for e in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")
        if e.get("class") == "step"
    ]
    rows: dict[str, list[tuple[float, float]]] = {}
    for e in steps:
        left = float(e.get("x"))
        rows.setdefault(e.get("y"), []).append((left, left + label_width(e.text)))
    for spans_in_row in rows.values():
        spans_in_row.sort()
        for (_, right), (left, _) in zip(spans_in_row, spans_in_row[1:], strict=False):
            assert right <= left, f"step labels overlap: {spans_in_row}"
    texts = [e.text for e in steps]
    assert "from 330 \u2192 ckpt 640" in texts  # the short attempt: one joined label
    assert "from 640" in texts and "ckpt 1000" in texts  # a long one: one at each end
    # notice at 3055, first step 3074: 19 s, in the chart's one unit (the job ran 100 min)
    assert "resumed 0.3 min after the interruption" in svg


def test_a_rebalance_recommendation_saves_at_once_and_the_step_goes_on(tmp_path):
    """The watcher writes a rebalance into the notice file: the next step saves (cheap
    insurance) and the loop goes on; the interruption that follows saves and stops."""
    from spot_core.errors import Preempted

    notice = tmp_path / "notice.json"
    store = open_store((tmp_path / "store").as_uri())
    ckpt = Checkpointer(store, attempt=1, every_steps=100, notice_file=str(notice))
    ckpt.maybe_save(1, lambda: {"w": b"1"})
    assert store.latest() is None  # no schedule due yet
    notice.write_text(json.dumps({"event": "rebalance", "detected_at": 1.0}))
    ref = ckpt.maybe_save(2, lambda: {"w": b"2"})
    assert ref is not None and ref.step == 2 and ref.metadata.get("rebalance") is True
    assert ckpt.maybe_save(3, lambda: {"w": b"3"}) is None  # once per recommendation
    assert not ckpt.emergency_requested
    time.sleep(0.01)
    notice.write_text(json.dumps({"event": "interruption", "detected_at": 2.0}))
    with pytest.raises(Preempted):
        ckpt.maybe_save(4, lambda: {"w": b"4"})
    assert store.latest().step == 4 and "emergency" in store.latest().metadata
