"""What the Prefect artifacts of a job show a reader (issue 50): headers in words, numbers
rounded, a summary table with a real header row, counts that agree, the clock named, and
no saving for a failed job. The artifacts' data is built without a server; the example
flow's test (test_example_flow.py) checks them as the Prefect API stores them."""

from __future__ import annotations

import dataclasses
import json
import re

from prefect_spot.artifacts import attempts_table, chart_markdown, summary_markdown
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool

SPOT = Pool("local", "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)


def _record(time_scale: float = 3600.0) -> JobRecord:
    """Preempted twice (the second resumed from the start), then finished."""
    record = JobRecord(job_id="flow.train", created_at=1_000.0, time_scale=time_scale)
    for n, (start, end, outcome, step_from) in enumerate(
        [
            (1_000.0, 1_003.3, Outcome.PREEMPTED, None),
            (1_004.0, 1_007.0, Outcome.PREEMPTED, None),
            (1_008.0, 1_012.0, Outcome.SUCCEEDED, 250),
        ],
        start=1,
    ):
        record = record.start_attempt(Attempt(n, SPOT, start, lease_id=f"l-{n}")).finish_attempt(
            Attempt(
                n,
                SPOT,
                start,
                lease_id=f"l-{n}",
                ended_at=end,
                outcome=outcome,
                cost=9.09934401512146 / n,
                on_demand_cost=30.123456789,
                checkpoint_step_start=step_from,
                checkpoint_step_end=250 + n,
                lost_work_seconds=1234.56789,
                notice_at=end - 0.25 if outcome is Outcome.PREEMPTED else None,
                resumed_at=start + 0.4 if n > 1 else None,
            )
        )
    return record


def test_the_attempts_table_is_headed_in_words_and_rounded():
    rows = attempts_table(_record())
    assert all("_" not in key for row in rows for key in row), rows[0].keys()
    assert "time to resume (h)" in rows[0] and "lost work (h)" in rows[0]
    text = json.dumps(rows)
    assert "9.09934401512146" not in text and "1234.56789" not in text
    assert not re.search(r"\d\.\d{5,}", text), text  # no long fractions anywhere
    assert rows[0]["cost"] == "$9.10" and rows[1]["lost work (h)"] == "0.34"


def test_the_summary_has_a_header_row_counts_that_agree_and_its_clock():
    summary = summary_markdown(_record())
    assert "| | |" not in summary and "| figure | value |" in summary
    # two resumes (one from the start), each with its time to resume: one list
    assert "| resumed (2) | from the start in 1.35 h, from step 250 in 1.65 h |" in summary
    assert "capacity time" in summary and "time scale 3600" in summary
    assert "capacity time" in chart_markdown(_record())


def test_a_failed_job_claims_no_saving():
    failed = dataclasses.replace(_record(), status="failed")
    assert "| saved | no saving (the job failed) |" in summary_markdown(failed)
