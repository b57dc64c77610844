"""``PriceWindowTimetable``: one run per day at the cheapest forecast hour of a window.

Each day's window (e.g. 00:00-08:00 UTC) is the run's data interval; the run starts at
the start the price-window policy plans for a ``job_hours`` job from a precomputed
hour-of-week price profile (``spot_core.policy.price_window``). The plan reads only the
profile, so the schedule is deterministic: the same profile gives the same times on
every scheduler. Registered through the provider's plugin so the scheduler can
deserialise it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.timetables.base import DagRunInfo, DataInterval, Timetable

try:  # Airflow's own pendulum-compatible datetime type
    from pendulum import DateTime
    from pendulum import instance as _as_pendulum
except ImportError:  # pragma: no cover
    DateTime = datetime  # type: ignore[misc,assignment]

    def _as_pendulum(value):  # type: ignore[no-redef]
        return value


class PriceWindowTimetable(Timetable):
    """Daily runs placed at the cheapest forecast slot inside ``[start_hour, end_hour)`` UTC.

    :param profile: an ``HourOfWeekProfile`` or its ``to_dict()``.
    :param job_hours: how long the scheduled job runs; it must fit in the window.
    :param start_hour / end_hour: the daily window in UTC hours (end may be 24).
    """

    description = "daily, at the cheapest spot hour inside a window"

    def __init__(
        self, *, profile: Any, job_hours: float, start_hour: int = 0, end_hour: int = 8
    ) -> None:
        from spot_core.errors import ConfigError
        from spot_core.policy.price_window import HourOfWeekProfile

        data = profile.to_dict() if hasattr(profile, "to_dict") else profile
        if not isinstance(data, Mapping):
            raise ValueError(
                f"PriceWindowTimetable: profile={type(data).__name__} is not an "
                "HourOfWeekProfile or its to_dict(); build one with build_profile()"
            )
        try:
            self._profile = HourOfWeekProfile.from_dict(data)
        except ConfigError as exc:
            raise ValueError(f"PriceWindowTimetable: profile: {exc}") from None
        self.profile = dict(data)
        hours = (start_hour, end_hour)
        if not (
            all(isinstance(h, int) and not isinstance(h, bool) for h in hours)
            and 0 <= start_hour < end_hour <= 24
        ):
            raise ValueError(
                f"PriceWindowTimetable: the window {start_hour!r}-{end_hour!r} h "
                "is not inside one day; use whole hours with 0 <= start_hour < "
                "end_hour <= 24"
            )
        if (
            isinstance(job_hours, bool)
            or not isinstance(job_hours, (int, float))
            or not 0 < job_hours <= end_hour - start_hour
        ):
            raise ValueError(
                f"PriceWindowTimetable: job_hours={job_hours!r} must be > 0 and "
                f"fit in the {end_hour - start_hour} h window (a number of hours)"
            )
        self.job_hours = float(job_hours)
        self.start_hour = start_hour
        self.end_hour = end_hour

    # -- serialisation -------------------------------------------------------------------------
    def serialize(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "job_hours": self.job_hours,
            "start_hour": self.start_hour,
            "end_hour": self.end_hour,
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> PriceWindowTimetable:
        return cls(
            profile=data["profile"],
            job_hours=data["job_hours"],
            start_hour=data["start_hour"],
            end_hour=data["end_hour"],
        )

    @property
    def summary(self) -> str:
        return (
            f"daily {self.start_hour:02d}:00-{self.end_hour:02d}:00 UTC, cheapest start for "
            f"a {self.job_hours:g} h spot job"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PriceWindowTimetable) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash((self.job_hours, self.start_hour, self.end_hour))

    # -- planning ------------------------------------------------------------------------------
    def window_of(self, day: datetime) -> DataInterval:
        midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return DataInterval(
            _as_pendulum(midnight + timedelta(hours=self.start_hour)),
            _as_pendulum(midnight + timedelta(hours=self.end_hour)),
        )

    def planned_start(self, window: DataInterval) -> DateTime:
        from spot_core.policy.price_window import plan_start

        start, end = window.start.timestamp(), window.end.timestamp()
        plan = plan_start(
            self._profile, job_hours=self.job_hours, window_start=start, window_end=end, now=start
        )
        return _as_pendulum(datetime.fromtimestamp(plan.start_at, tz=UTC))

    def infer_manual_data_interval(self, *, run_after: DateTime) -> DataInterval:
        return self.window_of(run_after)

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction
    ) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            day = last_automated_data_interval.start + timedelta(days=1)
        elif restriction.earliest is not None:
            day = restriction.earliest
            if not restriction.catchup:
                day = max(day, datetime.now(UTC))
            if self.window_of(day).start < day:  # this day's window has begun: next day
                day = day + timedelta(days=1)
        else:
            return None
        window = self.window_of(day)
        if restriction.latest is not None and window.start > restriction.latest:
            return None
        return DagRunInfo(run_after=self.planned_start(window), data_interval=window)
