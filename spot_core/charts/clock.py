"""One clock and one duration unit per surface, and money that never reads $0.00 beside a
saving.

A record's costs, lost work and checkpoint overhead are in its provider's capacity time;
its ``*_at`` stamps and time to resume are wall time. On a trace market (the local cloud)
the two differ by ``time_scale`` (3600: a wall second is billed as an hour), so every
view converts its durations to capacity time, picks one unit for the whole page, and says
which clock that is. Pure: records in, strings out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from spot_core.model import JobRecord

UNITS = ((3600.0, "h"), (60.0, "min"), (1.0, "s"))


@dataclass(frozen=True)
class Clock:
    """The clock of one page: capacity seconds per wall second (1: wall time) and the one
    unit its durations are written in."""

    time_scale: float = 1.0
    unit_seconds: float = 1.0
    unit: str = "s"
    mixed: bool = False  # jobs of several clocks on one page (each converted to its own)

    @property
    def is_wall(self) -> bool:
        return self.time_scale == 1.0 and not self.mixed

    def capacity(self, wall_seconds: float, time_scale: float | None = None) -> float:
        """A wall duration in this page's clock (a job's own ``time_scale`` if given)."""
        return wall_seconds * (self.time_scale if time_scale is None else time_scale)

    def number(self, capacity_seconds: float) -> str:
        """A duration as a number in the page's unit (for a column headed with it)."""
        value = capacity_seconds / self.unit_seconds
        return f"{value:.2f}" if self.unit == "h" else f"{value:.1f}"

    def duration(self, capacity_seconds: float) -> str:
        """A duration with the page's unit: ``1.25 h``."""
        return f"{self.number(capacity_seconds)} {self.unit}"

    def note(self) -> str:
        """The clock in a few words, for a chart's title: ``capacity time, 1 s = 1 h``."""
        if self.mixed:
            return "each job's capacity time"
        if self.time_scale == 1.0:
            return "wall time"
        return f"capacity time, 1 s = {_scale_words(self.time_scale)}"

    def sentence(self) -> str:
        """What a reader needs to read the page's numbers: which clock, and its scale."""
        if self.mixed:
            return (
                "Costs and durations are in each job's capacity time: jobs on a trace "
                "market (the local spot cloud) replay it faster than the wall clock; "
                f"durations in {UNIT_WORDS[self.unit]}, clock times in wall time (UTC)."
            )
        if self.time_scale == 1.0:
            return (
                f"Costs and durations are in wall time, durations in "
                f"{UNIT_WORDS[self.unit]}; clock times in UTC."
            )
        return (
            "Costs and durations are in capacity time: the trace market replays 1 wall "
            f"second as {_scale_words(self.time_scale)} of capacity (time scale "
            f"{self.time_scale:g}), and bills it so; durations in {UNIT_WORDS[self.unit]}, "
            "clock times in wall time (UTC)."
        )


UNIT_WORDS = {"h": "hours", "min": "minutes", "s": "seconds"}


def _scale_words(time_scale: float) -> str:
    seconds = time_scale
    for size, unit in UNITS:
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def clock_of(records: Iterable[JobRecord]) -> Clock:
    """The clock of a page showing ``records``: their common ``time_scale`` (or mixed),
    and the unit that suits the longest span any of them ran, in capacity time."""
    records = list(records)
    scales = {r.time_scale for r in records}
    longest = max(
        (
            max(
                [_ran(r) * r.time_scale, r.ledger.lost_work_seconds]
                + [r.ledger.checkpoint_overhead_seconds]
            )
            for r in records
        ),
        default=0.0,
    )
    size, unit = next(((s, u) for s, u in UNITS if longest >= 2 * s), UNITS[-1])
    return Clock(
        time_scale=scales.pop() if len(scales) == 1 else 1.0,
        unit_seconds=size,
        unit=unit,
        mixed=len(scales) > 1,
    )


def _ran(record: JobRecord) -> float:
    """Wall seconds from the first attempt's start to the last one's end."""
    if not record.attempts:
        return 0.0
    start = min(a.started_at for a in record.attempts)
    end = max((a.ended_at or a.started_at) for a in record.attempts)
    return max(0.0, end - start)


def money(value: float) -> str:
    """Dollars with as many decimals as the amount needs to show two significant digits
    (never ``$0.00`` for a non-zero amount): ``$1,234.50``, ``$0.0042``, ``$0.000031``."""
    if value == 0:
        return "$0.00"
    if abs(value) >= 1:
        return f"${value:,.2f}" if value > 0 else f"-${-value:,.2f}"
    places = 2
    while abs(value) < 10 ** (1 - places) and places < 10:
        places += 1
    text = f"{abs(value):.{places}f}"
    return f"${text}" if value > 0 else f"-${text}"


def saving(record: JobRecord, *, verb: bool = True) -> str:
    """The saving a record can claim, or why it claims none: ``saved $1.20 (41%)``
    (``$1.20 (41%)`` without ``verb``, in a cell headed "saved"), ``no saving (the job
    failed)``."""
    claimed = record.saving_claimed
    if claimed is None:
        return f"no saving (the job {_status_words(str(record.status))})"
    amount = f"{money(claimed)} ({record.ledger.savings_fraction:.0%})"
    return f"saved {amount}" if verb else amount


def _status_words(status: str) -> str:
    return "missed its deadline" if status == "deadline_missed" else status
