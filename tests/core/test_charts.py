"""The SVG charts: well-formed, one bar per attempt (what a browser test counts), labels
from records escaped (a zone or job id can never open a tag), numbers a user reads."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from spot_core.charts import attempt_timeline, cost_chart, lost_work_chart, savings_over_time
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool

SVG = "{http://www.w3.org/2000/svg}"
EVIL = '<script>alert("x")</script>&"'
SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
EVIL_SPOT = Pool("aws", "us-east-2", EVIL, "p3.2xlarge")
ON_DEMAND = SPOT.on(Market.ON_DEMAND)


def _attempt(
    record: JobRecord, pool: Pool, start: float, end: float, outcome: Outcome, **kw
) -> JobRecord:
    number = record.next_attempt_number
    record = record.start_attempt(Attempt(number, pool, start))
    return record.finish_attempt(Attempt(number, pool, start, ended_at=end, outcome=outcome, **kw))


def three_attempts(job_id: str = "train-42") -> JobRecord:
    record = JobRecord(job_id=job_id, created_at=1_700_000_000.0)
    t = record.created_at
    record = _attempt(
        record,
        SPOT,
        t,
        t + 600,
        Outcome.PREEMPTED,
        cost=0.3,
        on_demand_cost=3.06,
        checkpoint_step_end=400,
        lost_work_seconds=120.0,
        checkpoint_overhead_seconds=8.0,
        message=EVIL,
    )
    record = _attempt(
        record,
        EVIL_SPOT,
        t + 660,
        t + 1200,
        Outcome.PREEMPTED,
        cost=0.25,
        on_demand_cost=2.8,
        checkpoint_step_start=400,
        checkpoint_step_end=800,
        lost_work_seconds=60.0,
    )
    return _attempt(
        record,
        ON_DEMAND,
        t + 1260,
        t + 2400,
        Outcome.SUCCEEDED,
        cost=3.06,
        on_demand_cost=3.06,
        checkpoint_step_start=800,
        checkpoint_step_end=1000,
    )


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything a browser would not parse as SVG
    assert root.tag == f"{SVG}svg"
    return root


def _with_class(root: ET.Element, tag: str, name: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if name in e.get("class", "").split()]


def test_timeline_has_one_bar_per_attempt_coloured_by_outcome_with_pool_and_market():
    svg = attempt_timeline(three_attempts())
    bars = _with_class(_parse(svg), "rect", "attempt")
    assert [b.get("data-attempt") for b in bars] == ["1", "2", "3"]
    assert [b.get("data-outcome") for b in bars] == ["preempted", "preempted", "succeeded"]
    assert [b.get("data-market") for b in bars] == ["spot", "spot", "on-demand"]
    assert bars[0].get("fill") != bars[2].get("fill")
    # bars follow the clock: the second starts after the first ends
    assert float(bars[1].get("x")) > float(bars[0].get("x")) + float(bars[0].get("width"))
    assert "us-east-1a p3.2xlarge on-demand" in svg
    assert len(_with_class(_parse(svg), "path", "notice")) == 2  # one per preemption
    assert "from 400" in svg and "ckpt 800" in svg  # resumed-from and last checkpoint


def test_every_chart_escapes_labels_from_the_record():
    record = three_attempts(job_id=EVIL)
    for svg in (
        attempt_timeline(record),
        cost_chart(record),
        lost_work_chart(record),
        savings_over_time([(EVIL, record)]),
    ):
        root = _parse(svg)
        assert "<script" not in svg
        assert not list(root.iter(f"{SVG}script")) and not list(root.iter("script"))
        assert EVIL in "".join(root.itertext()) or any(
            EVIL in (v or "") for e in root.iter() for v in e.attrib.values()
        )


def test_cost_chart_shows_paid_against_on_demand_per_attempt_and_in_total():
    record = three_attempts()
    root = _parse(cost_chart(record))
    paid = _with_class(root, "rect", "paid-cost")
    assert [p.get("data-attempt") for p in paid] == ["1", "2", "3", None]
    total_paid, total_od = paid[-1], _with_class(root, "rect", "on-demand-cost")[-1]
    assert float(total_paid.get("width")) / float(total_od.get("width")) == pytest.approx(
        record.ledger.spent / record.ledger.on_demand_equivalent, rel=1e-2
    )
    assert "saved $5.31 (60%)" in cost_chart(record)


def test_lost_work_chart_has_a_bar_per_attempt_proportional_to_lost_work():
    root = _parse(lost_work_chart(three_attempts()))
    lost = _with_class(root, "rect", "lost-work")
    widths = [float(b.get("width")) for b in lost]
    assert len(lost) == 3 and widths[2] == 0
    assert widths[0] > widths[1] > 0


def test_savings_over_time_draws_a_cumulative_line_per_series_and_a_dot_per_job():
    first, second = three_attempts("a"), three_attempts("b")
    later = JobRecord.from_dict({**second.to_dict(), "job_id": "c"})
    svg = savings_over_time([("dag1.train", first), ("dag2.train", second), ("dag1.train", later)])
    root = _parse(svg)
    assert {s.get("data-series") for s in _with_class(root, "polyline", "series")} == {
        "dag1.train",
        "dag2.train",
    }
    assert sorted(c.get("data-job") for c in _with_class(root, "circle", "job")) == ["a", "b", "c"]
    assert f"${3 * first.ledger.saved:,.2f} over 3 jobs" in svg


def test_charts_of_an_empty_or_running_record_still_render():
    empty = JobRecord(job_id="fresh", created_at=0.0)
    running = empty.start_attempt(Attempt(1, SPOT, 10.0))
    for svg in (
        attempt_timeline(empty),
        attempt_timeline(running, now=70.0),
        cost_chart(running),
        lost_work_chart(empty),
        savings_over_time([]),
    ):
        _parse(svg)
    bar = _with_class(_parse(attempt_timeline(running, now=70.0)), "rect", "attempt")[0]
    assert bar.get("data-outcome") == "running"
