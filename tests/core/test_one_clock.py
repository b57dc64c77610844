"""One clock per number, said on the surface (issue 50): what a reader of `report --html`,
the charts and the fleet figures sees for a job on a trace market (capacity time, 1 wall
second billed as an hour), a Kubernetes job costing fractions of a cent, a job that failed,
and jobs that all ended in the same minute."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET

from spot_core.charts import cost_chart, lost_work_chart, savings_over_time
from spot_core.charts.svg import TITLE_CHAR_WIDTH
from spot_core.fleet import pool_figures
from spot_core.model import Attempt, JobRecord, JobStatus, Market, Outcome, Pool
from spot_core.report import html_page, ledger_lines

SPOT = Pool("local", "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
ON_DEMAND = Pool("local", "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
SVG = "{http://www.w3.org/2000/svg}"


def _trace_job(time_scale: float = 3600.0, job_id: str = "train") -> JobRecord:
    """The demo's shape: 16.6 wall seconds on a trace market, preempted twice (once
    resumed from the start), then on-demand; the last one with a notice 4 s before."""
    record = JobRecord(job_id=job_id, created_at=1_000.0, time_scale=time_scale)
    spans = [
        (1, SPOT, 1_000.0, 1_004.0, Outcome.PREEMPTED, None, 300, 1.10, 3.06),
        (2, SPOT, 1_005.0, 1_009.0, Outcome.PREEMPTED, None, None, 1.20, 3.06),
        (3, ON_DEMAND, 1_010.0, 1_016.6, Outcome.SUCCEEDED, 300, 1000, 5.05, 5.05),
    ]
    for number, pool, start, end, outcome, step_from, step_to, cost, od in spans:
        attempt = Attempt(number, pool, start, lease_id=f"l-{number}")
        record = record.start_attempt(attempt).finish_attempt(
            Attempt(
                number,
                pool,
                start,
                lease_id=f"l-{number}",
                ended_at=end,
                outcome=outcome,
                cost=cost,
                on_demand_cost=od,
                checkpoint_step_start=step_from,
                checkpoint_step_end=step_to,
                lost_work_seconds=1800.0 if outcome is Outcome.PREEMPTED else 0.0,
                checkpoint_overhead_seconds=216.0,
                notice_at=end - 0.5 if outcome is Outcome.PREEMPTED else None,
                resumed_at=start + 0.5 if number > 1 else None,
            )
        )
    return record


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_the_report_page_says_its_costs_are_capacity_time_with_the_scale():
    page = html_page(_trace_job())
    assert "capacity time" in page and "1 wall second as 1 h" in page
    assert "time scale 3600" in page
    # one duration unit on the page: hours (the job ran 16.6 trace hours)
    assert "lost work 1.00 h" in page and "checkpoint overhead 0.18 h" in page
    assert " s after" not in page and " s (" not in page


def test_a_wall_clock_record_says_wall_time():
    lines = ledger_lines(_trace_job(time_scale=1.0))
    assert "wall time" in lines and "capacity time" not in lines


def test_the_record_carries_its_clock_and_old_records_read_as_wall_time():
    record = _trace_job()
    assert JobRecord.from_json(record.to_json()).time_scale == 3600.0
    data = json.loads(record.to_json())
    del data["time_scale"]
    assert JobRecord.from_dict(data).time_scale == 1.0


def test_pool_rates_are_in_the_clock_of_the_costs_beside_them():
    """The Spot jobs page printed 2251.56 interruptions per hour and 0.001 hours on spot
    (wall hours) beside costs in trace hours; in trace hours: 2 in 8 hours."""
    (pool,) = pool_figures([_trace_job()])
    assert pool.spot_hours == 8.0
    assert pool.interruptions_per_hour == 0.25


def test_costs_of_a_fraction_of_a_cent_are_never_shown_as_zero():
    """The Kubernetes demo printed `spot cost $0.00 vs on-demand $0.00: saved $0.00 (41%)`."""
    record = _trace_job(time_scale=1.0)
    tiny = JobRecord(job_id="k8s", created_at=0.0, time_scale=1.0)
    for attempt in record.attempts:
        tiny = tiny.start_attempt(
            Attempt(attempt.number, attempt.pool, attempt.started_at)
        ).finish_attempt(
            Attempt(
                attempt.number,
                attempt.pool,
                attempt.started_at,
                ended_at=attempt.ended_at,
                outcome=attempt.outcome,
                cost=attempt.cost / 1000,
                on_demand_cost=attempt.on_demand_cost / 1000,
            )
        )
    lines = ledger_lines(tiny)
    assert "$0.00 " not in lines and "$0.00:" not in lines, lines
    shown = r"spot cost \$0\.007\d vs on-demand \$0\.011: saved \$0\.003\d \(3\d%\)"
    assert re.search(shown, lines), lines
    assert "$0.00<" not in html_page(tiny) and "$0.00 " not in _text(html_page(tiny))


def test_a_failed_or_late_job_claims_no_saving():
    for status, words in (
        (JobStatus.FAILED, "the job failed"),
        (JobStatus.DEADLINE_MISSED, "the job missed its deadline"),
    ):
        record = _trace_job().with_status(status)
        lines = ledger_lines(record)
        assert f"no saving ({words})" in lines and "saved $" not in lines
        assert "saved $" not in _text(html_page(record))
        assert "saved $" not in cost_chart(record)
        assert "$0.00 over 1 jobs" in savings_over_time([("dag.train", record)])


def test_resumes_and_times_to_resume_are_one_list():
    """A Prefect summary listed 2 resumed-from steps against 3 times to resume: a resume
    from the start had a time but no step."""
    lines = ledger_lines(_trace_job())  # notice to first step: 2 wall s, 2 trace hours
    assert "resumed 2 times: from the start in 2.00 h, from step 300 in 2.00 h" in lines


def test_the_lost_work_title_keeps_one_unit():
    """It read "Lost work 0 s, checkpoint overhead 0.06 h"."""
    record = _trace_job()
    record = dataclasses.replace(
        record, ledger=dataclasses.replace(record.ledger, lost_work_seconds=0.0)
    )
    title = ET.fromstring(lost_work_chart(record)).find(f"{SVG}title").text
    assert "Lost work 0.00 h, checkpoint overhead 0.18 h" in title


def test_chart_titles_wrap_inside_the_chart():
    """The cost chart's title was cut at "...$190.71 on-dema"."""
    record = _trace_job(job_id="spot_ml_pipeline__manual__2026-12-07T15:49:01+00:00__train")
    for svg in (cost_chart(record), lost_work_chart(record)):
        root = ET.fromstring(svg)
        width = float(root.get("width"))
        lines = [e for e in root.iter(f"{SVG}text") if e.get("class") == "title"]
        assert len(lines) >= 2
        for line in lines:
            assert float(line.get("x")) + len(line.text) * TITLE_CHAR_WIDTH <= width
        assert " ".join(e.text for e in lines) == root.find(f"{SVG}title").text


def test_the_savings_axis_stays_distinct_when_jobs_end_together():
    """Four x labels all read "12-07 15:49" for jobs that ended within a minute."""
    jobs = [
        (f"dag.task{i}", _trace_job(job_id=f"j{i}").with_status(JobStatus.SUCCEEDED))
        for i in range(3)
    ]
    root = ET.fromstring(savings_over_time(jobs))
    stamps = [
        e.text
        for e in root.iter(f"{SVG}text")
        if e.get("text-anchor") == "middle" and e.get("font-size") == "10"
    ]
    assert len(stamps) == 4 and len(set(stamps)) == 4, stamps
