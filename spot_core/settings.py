"""Every user-facing knob of a spot job, declared once: ``SpotSettings``.

``SpotSettings`` is an ordinary frozen dataclass. Each field is one knob: its default is
written after the ``=``, its ``Knob`` (the name the surfaces show, type, unit, help,
bounds from ``spot_core.bounds``, surfaces, old names) is attached with ``Annotated``, so a
reader (or an IDE) follows ``settings.capacity_wait_seconds`` from a surface to its use.
The CLI (``spot-pipelines run``), ``SpotJobOperator``, ``SpotKubernetesPodOperator``,
``@task.spot``, Prefect's ``SpotConfiguration`` block, the ``spot`` worker's work-pool
variables, ``spot_task`` and ``SpotTaskRunner`` take their defaults, help and checks from
here, and a table test per engine compares every surface with this model. The command
line's flags are built from these declarations in ``spot_core.commands.flags``.

Names. A surface shows the knob's name (``capacity_wait``, ``deadline``, ``work``); the
field carries its unit (``capacity_wait_seconds``): ``*_seconds`` for durations,
``*_capacity_seconds`` for durations in capacity time, ``*_at`` for instants. The retry
budgets' defaults are the pure retry policy's (``RetryPolicy``, on a floor below this
one), written there once and read here.

One unit convention: a duration knob accepts a number of seconds, a
``datetime.timedelta`` or a string such as ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``,
``"1h30m"`` (``spot_core.durations.parse_duration``, also the CLI's parser) and is stored
as float seconds. The old suffixed names (``capacity_wait_seconds``,
``min_on_demand_seconds``, ...) and ``max_price_per_hour`` still work on every surface
with a ``DeprecationWarning``.

Deadline-bound jobs, one time convention on every surface (``wall_deadline`` turns it
into the job's wall-clock deadline, ``SpotSettings.deadline_spec`` into JobSpec's fields):
the durations ``deadline``, ``work`` and ``restart_overhead`` count in *capacity time*,
the provider's clock (``Provider.capacity_seconds``). On EC2 and Kubernetes capacity time
is wall time; on the local cloud it is trace time, which runs ``time_scale`` times faster
than the wall clock, so ``deadline="12h"`` with ``time_scale=3600`` ends 12 wall seconds
after the job starts, and ``work="6h"`` is 6 trace hours of compute. An absolute
``deadline`` (a ``datetime``, or an ISO time such as ``"2026-12-01T08:00Z"``; without a
zone it is UTC) is a wall-clock time on every provider: the knob ``deadline`` fills
``deadline_capacity_seconds`` or ``deadline_at``, never both. A duration deadline counts
from the job's creation (its JobRecord's ``created_at``: the first try, not the current
one).

    settings = SpotSettings.build(where="train", capacity_wait="2m", max_spot_price=0.9)
    settings.capacity_wait_seconds             # 120.0
    policy = settings.retry_policy()           # the pure policy's input
    Controller(provider, market, policy, **settings.controller_options())
"""

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, get_type_hints

from spot_core.bounds import (
    MAX_COUNT,
    MAX_KEEP,
    MAX_PRICE,
    MAX_RATE,
    MAX_SPAN_SECONDS,
    MAX_STEPS,
    MAX_WAIT_SECONDS,
)
from spot_core.durations import format_duration, parse_duration, parse_time
from spot_core.errors import ConfigError
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.registry import DEFAULT_PROVIDER, NO_PROVIDER_INSTALLED

# Surfaces: where a knob can be set.
CLI = "cli"  # spot-pipelines run
OPERATOR = "operator"  # SpotJobOperator
POD_OPERATOR = "pod_operator"  # SpotKubernetesPodOperator (provider kubernetes; KPO's image)
DECORATOR = "decorator"  # @task.spot
BLOCK = "block"  # prefect SpotConfiguration block (also SpotTaskRunner's config)
WORKER = "worker"  # prefect spot worker: job variables and job configuration
SPOT_TASK = "spot_task"  # prefect spot_task
TASK_RUNNER = "task_runner"  # prefect SpotTaskRunner's own arguments
SURFACES = (CLI, OPERATOR, POD_OPERATOR, DECORATOR, BLOCK, WORKER, SPOT_TASK, TASK_RUNNER)

_ENGINE = frozenset({OPERATOR, POD_OPERATOR, BLOCK, WORKER})
_JOB = frozenset({CLI}) | _ENGINE
_IN_PLACE = frozenset({DECORATOR, SPOT_TASK, TASK_RUNNER})

# When a reclaimed attempt's replacement is launched (the handover knob; the controller).
HANDOVER_MODES = ("off", "on_notice", "on_rebalance")
# The fields ``retry_policy`` reads (``max_user_retries`` aside: an engine passes its own).
POLICY_FIELDS = (
    "max_preemptions",
    "max_infrastructure_retries",
    "max_disruptions",
    "on_demand_fallback",
    "return_to_spot",
    "capacity_wait_seconds",
    "max_capacity_waits",
    "min_on_demand_seconds",
    "max_spot_price",
)

# Kinds of value a knob holds.
INT, NUMBER, BOOL, DURATION, TEXT, NAMES, MAPPING = (
    "int",
    "number",
    "bool",
    "duration",
    "text",
    "names",
    "mapping",
)

# Documented maximums, one per kind of number (spot_core.bounds, docs/reliability.md).
MAX_WAIT = MAX_WAIT_SECONDS  # 1d: no wait, poll, timeout or interval above a day
MAX_SPAN = MAX_SPAN_SECONDS  # 365d of capacity time: deadlines, work, an attempt's limit
WHY_SPAN = "a year of capacity time: plan a longer job as several"


def wall_deadline(
    deadline: float | datetime | None, *, created_at: float, capacity_per_wall: float
) -> float | None:
    """The job's deadline as a wall-clock POSIX time: the one place the time convention
    (module docstring) is applied. ``deadline``: capacity seconds from ``created_at`` (the
    JobRecord's), or an absolute ``datetime`` (wall time). ``capacity_per_wall``: the
    provider's capacity seconds per wall second (``provider.capacity_seconds(1.0)``; the
    local cloud's ``time_scale``, 1 elsewhere)."""
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        return deadline.timestamp()
    if not (math.isfinite(capacity_per_wall) and capacity_per_wall > 0):
        raise ConfigError(
            f"capacity_per_wall={capacity_per_wall!r} must be a number > 0 "
            "(the provider's capacity seconds per wall second)"
        )
    return created_at + deadline / capacity_per_wall


# -- knobs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """One setting as the surfaces show it: its name there, its kind, help, checks and
    surfaces. ``SpotSettings`` binds each to its field (``field``, ``default``).

    ``kind`` is one of int, number, bool, duration, text, names (a list of strings),
    mapping. ``minimum`` is inclusive unless ``strict``. ``optional`` lets None through
    (meaning "off" or "none"). ``choices`` is a tuple or a callable giving one (so the
    provider registry, not this file, says which providers are installed).
    """

    name: str
    kind: str
    help: str
    surfaces: frozenset[str]
    unit: str = ""
    minimum: float | None = None
    strict: bool = False
    # Inclusive; every number has one (durations, counts, prices): a finite but absurd
    # value (1e300 s between polls, 10^20 windows) is refused where it is parsed, not
    # left to crash a thread or exhaust the machine later.
    maximum: float | None = None
    optional: bool = False
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    aliases: tuple[str, ...] = ()
    refusal: str = "is not one of"  # what an unknown choice is called in the error
    # What the refusal says when there is no choice at all (no provider installed): the
    # fix, where "choose one of" would list nothing.
    no_choices: str = ""
    # A check of the parsed value that its kind cannot express (an image reference):
    # raises a one-line ConfigError; run on every value but None.
    check: Callable[[Any], None] | None = None
    # A duration knob that also takes an absolute time (a datetime or an ISO string),
    # kept as a timezone-aware datetime in the field named here: the deadline.
    absolute_field: str | None = None
    # What the CLI's help calls the value, where its kind's word (NAME, N) would mislead.
    metavar: str | None = None
    # Why the maximum is what it is, said with the refusal (the fix is then obvious).
    why_maximum: str = ""
    # A bound of the controller's lifecycle: ``Controller(<field>=value)``.
    controller: bool = False
    # Bound by ``SpotSettings``: the field that holds the value, and its default.
    field: str = ""
    default: Any = None

    @property
    def absolute(self) -> bool:
        return self.absolute_field is not None

    @property
    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def read(self, settings: "SpotSettings") -> Any:
        """The knob's value in ``settings`` as a surface shows it (the deadline: its
        absolute time when it has one, else its duration)."""
        if self.absolute_field is not None:
            when = getattr(settings, self.absolute_field)
            if when is not None:
                return when
        return getattr(settings, self.field)

    def parse(self, value: Any) -> Any:
        """``value`` checked and normalised (durations to float seconds, lists to tuples)."""
        if value is None and (self.optional or self.default is None):
            return None
        parsed = getattr(self, f"_parse_{self.kind}")(value)
        if self.check is not None:
            try:
                self.check(parsed)
            except ConfigError as exc:
                raise self._fail(value, f"is refused: {exc}") from None
        return parsed

    def _fail(self, value: Any, what: str) -> ConfigError:
        return ConfigError(f"{self.name}={value!r} {what}")

    def _check_minimum(self, value: Any, number: float) -> None:
        """The knob's range: its minimum, then its maximum (the one line names both)."""
        if self.minimum is not None:
            ok = number > self.minimum if self.strict else number >= self.minimum
            if not ok:
                bound = "> " if self.strict else ">= "
                raise self._fail(
                    value,
                    f"must be {bound}{self.shown(self.minimum)}{self._unit_text}{self._range_text}",
                )
        if self.maximum is not None and number > self.maximum:
            raise self._fail(
                value,
                f"must be at most {self.shown(self.maximum)}{self._unit_text}{self._why_maximum}",
            )

    def shown(self, bound: float) -> str:
        """A bound as the knob's messages and help write it."""
        if self.kind == DURATION:
            return format_duration(bound)
        return f"{int(bound):,}" if bound == int(bound) else f"{bound:,g}"

    @property
    def _range_text(self) -> str:
        return "" if self.maximum is None else f" and at most {self.shown(self.maximum)}"

    @property
    def _why_maximum(self) -> str:
        return f" ({self.why_maximum})" if self.why_maximum else ""

    @property
    def _unit_text(self) -> str:
        return f" {self.unit}" if self.unit and self.kind != DURATION else ""

    def _parse_int(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(value, "must be a whole number")
        self._check_minimum(value, value)
        return value

    def _parse_number(self, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self._fail(value, f"must be a number{self._unit_text}")
        self._check_minimum(value, value)
        return float(value)

    def _parse_bool(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self._fail(value, "must be True or False")
        return value

    def _parse_duration(self, value: Any) -> float | datetime:
        if self.absolute and isinstance(value, datetime):
            return self._check_ahead(value, parse_time(value, name=self.name))
        try:
            seconds = parse_duration(value, name=self.name)
        except ConfigError:
            if not self.absolute:
                raise
            return self._check_ahead(value, parse_time(value, name=self.name))
        self._check_minimum(value, seconds)
        return seconds

    def _check_ahead(self, value: Any, when: datetime) -> datetime:
        """An absolute time at most ``maximum`` seconds of wall time from now."""
        if (
            self.maximum is not None
            and when.timestamp() - datetime.now(UTC).timestamp() > self.maximum
        ):
            raise self._fail(
                value, f"is more than {self.shown(self.maximum)} from now{self._why_maximum}"
            )
        return when

    def _parse_text(self, value: Any) -> str:
        allowed = self.allowed
        if allowed is not None and value not in allowed:
            if not allowed and self.no_choices:
                raise self._fail(value, self.no_choices)
            raise self._fail(value, f"{self.refusal} {', '.join(allowed)}")
        if not isinstance(value, str) or not value.strip():
            raise self._fail(value, "must be a non-empty string")
        return value

    def _parse_names(self, value: Any) -> tuple[str, ...]:
        if (
            isinstance(value, (str, bytes, Mapping))
            or not isinstance(value, Iterable)
            or not all(isinstance(v, str) and v.strip() for v in value)
        ):
            raise self._fail(value, "must be a list of names such as ['us-east-2a']")
        return tuple(value)

    def _parse_mapping(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self._fail(value, "must be a mapping of option names to values")
        return dict(value)


def _provider_choices() -> tuple[str, ...]:
    from spot_core.providers.registry import provider_names

    return provider_names()


def _cloud_choices() -> tuple[str, ...]:
    """``auto`` (probe the metadata services), then every registered notice detector."""
    from spot_core.interruption.registry import detector_names

    return ("auto", *detector_names())


def _check_image(image: str) -> None:
    """The container shim's check: nothing that ``docker run`` would read as a flag."""
    from spot_core.container import check_image

    check_image(image)


def _check_store_uri(uri: str) -> None:
    from spot_core.checkpoint.uri import parse_store_uri

    parse_store_uri(uri)


def _deadline_policy_choices() -> tuple[str, ...]:
    from spot_core.policy.deadline.policies import DEADLINE_POLICIES

    return tuple(n for n in DEADLINE_POLICIES.names() if n != "optimal")


# -- the model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpotSettings:
    """Validated values of every knob (durations in float seconds). Build from what a user
    wrote with ``SpotSettings.build(where=..., **values)`` (the surfaces' names); the
    constructor takes the fields' own names."""

    provider: Annotated[
        str,
        Knob(
            "provider",
            TEXT,
            "Capacity provider: `local` replays real spot traces on this "
            "machine (no cloud account); `ec2` is AWS EC2 (needs an s3:// checkpoint store); "
            "`kubernetes` runs pods on the cluster's spot node pools (a store its pods reach). "
            "`spot-pipelines providers` lists every one installed.",
            _JOB - {POD_OPERATOR},
            choices=_provider_choices,
            refusal="is not installed; choose one of",
            no_choices=NO_PROVIDER_INSTALLED,
        ),
    ] = DEFAULT_PROVIDER
    provider_options: Annotated[
        Mapping[str, Any],
        Knob(
            "provider_options",
            MAPPING,
            "Options for the provider, e.g. for `local` the `url` "
            "of a local cloud server or `time_scale`, `start_tick`; for `ec2` `region`, "
            "`subnets`, `image_id`, `instance_types`, `instance_profile`; for `kubernetes` "
            "`namespace`, `image`, `pod_template`, `prices` (never credentials).",
            _ENGINE,
        ),
    ] = field(default_factory=dict)
    zones: Annotated[
        tuple[str, ...],
        Knob(
            "zones",
            NAMES,
            "Zones to spread the job over (pool diversification). Empty: every "
            "zone the provider offers.",
            _ENGINE,
        ),
    ] = ()
    instance_types: Annotated[
        tuple[str, ...],
        Knob(
            "instance_types",
            NAMES,
            "Instance types allowed. Empty: every type the provider offers.",
            frozenset({BLOCK, WORKER}),
        ),
    ] = ()
    image: Annotated[
        str | None,
        Knob(
            "image",
            TEXT,
            "Run the command in this container image (Docker on the machine "
            "that runs the step). Empty: run it directly.",
            frozenset({CLI, OPERATOR}),
            optional=True,
            check=_check_image,
        ),
    ] = None
    max_preemptions: Annotated[
        int,
        Knob(
            "max_preemptions",
            INT,
            "Preemptions tolerated before the rest runs on on-demand; "
            "its own budget, never a retry of the step. 3 keeps most of the spot savings while "
            "bounding the work lost to restarts.",
            _JOB | {DECORATOR, SPOT_TASK},
            minimum=0,
            maximum=MAX_COUNT,
        ),
    ] = RetryPolicy.max_preemptions
    max_user_retries: Annotated[
        int,
        Knob(
            "max_user_retries",
            INT,
            "Retries when the command itself fails (the engines use "
            "their own `retries`). 0: a bug fails fast.",
            frozenset({CLI}),
            minimum=0,
            maximum=MAX_COUNT,
        ),
    ] = RetryPolicy.max_user_retries
    max_infrastructure_retries: Annotated[
        int,
        Knob(
            "max_infrastructure_retries",
            INT,
            "Attempts lost to failures outside the step's "
            "code (not preemptions) before the job fails.",
            _JOB,
            minimum=0,
            maximum=MAX_COUNT,
        ),
    ] = RetryPolicy.max_infrastructure_retries
    max_disruptions: Annotated[
        int,
        Knob(
            "max_disruptions",
            INT,
            "Voluntary disruptions tolerated (Kubernetes "
            "consolidation, drift, expiration, autoscaler scale-down, drains) before the job "
            "fails; each resumes from the checkpoint, spends no preemption and never moves the "
            "job to on-demand.",
            _JOB,
            minimum=0,
            maximum=MAX_COUNT,
        ),
    ] = RetryPolicy.max_disruptions
    on_demand_fallback: Annotated[
        bool,
        Knob(
            "on_demand_fallback",
            BOOL,
            "Run on on-demand when the preemption budget is spent, "
            "spot is scarce or the deadline is near; off: wait (bounded) for spot.",
            _JOB,
        ),
    ] = RetryPolicy.on_demand_fallback
    return_to_spot: Annotated[
        bool,
        Knob(
            "return_to_spot",
            BOOL,
            "Move back to spot when capacity returns after a fallback "
            "for lack of capacity (within the preemption budget); with a deadline_policy, also "
            "every other move its plan makes mid-run. Off: an attempt runs where it started.",
            _JOB,
        ),
    ] = RetryPolicy.return_to_spot
    min_on_demand_seconds: Annotated[
        float,
        Knob(
            "min_on_demand",
            DURATION,
            "How long an on-demand attempt runs before the job may "
            "move back to spot; 10m stops a flickering zone from making the job flap between "
            "markets (each move costs a restart).",
            _JOB,
            minimum=0,
            maximum=MAX_SPAN,
            why_maximum="to stay on on-demand for good, set return_to_spot=False",
            aliases=("min_on_demand_seconds",),
        ),
    ] = RetryPolicy.min_on_demand_seconds
    capacity_wait_seconds: Annotated[
        float,
        Knob(
            "capacity_wait",
            DURATION,
            "One wait for capacity or a cheaper price window; 60s "
            "is about how often spot capacity and prices change.",
            _JOB,
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            aliases=("capacity_wait_seconds",),
        ),
    ] = RetryPolicy.capacity_wait_seconds
    max_capacity_waits: Annotated[
        int,
        Knob(
            "max_capacity_waits",
            INT,
            "Waits (or launches in a row without capacity) before "
            "the job fails: with capacity_wait 60s, 10 bounds waiting at 10 minutes.",
            _JOB,
            minimum=1,
            maximum=MAX_COUNT,
        ),
    ] = RetryPolicy.max_capacity_waits
    max_spot_price: Annotated[
        float | None,
        Knob(
            "max_spot_price",
            NUMBER,
            "Highest spot price to pay: dearer spot pools are left "
            "alone and the job waits (bounded like a capacity wait) for a cheaper window, then "
            "falls back to on-demand. Empty: no cap.",
            _JOB,
            unit="USD/h",
            minimum=0,
            maximum=MAX_PRICE,
            strict=True,
            optional=True,
            metavar="USD_PER_HOUR",
            aliases=("max_price_per_hour",),
        ),
    ] = RetryPolicy.max_spot_price
    deadline_capacity_seconds: Annotated[
        float | None,
        Knob(
            "deadline",
            DURATION,
            "Time the job may take from its start, in capacity time "
            "(trace time on the local cloud, wall time elsewhere), or an absolute wall-clock "
            "time (a datetime, or ISO such as 2026-12-01T08:00Z): near it the job moves to "
            "on-demand; past it the job fails. Empty: no deadline.",
            _JOB,
            minimum=0,
            maximum=MAX_SPAN,
            why_maximum=WHY_SPAN,
            strict=True,
            optional=True,
            absolute_field="deadline_at",
            metavar="DURATION|TIME",
        ),
    ] = None
    # The ``deadline`` knob given as a time: a timezone-aware wall-clock instant.
    deadline_at: datetime | None = None
    attempt_timeout_seconds: Annotated[
        float,
        Knob(
            "attempt_timeout",
            DURATION,
            "Longest one attempt may run before it is terminated; "
            "24h bounds a hung step without cutting a long training run short.",
            _JOB,
            minimum=0,
            maximum=MAX_SPAN,
            strict=True,
            controller=True,
        ),
    ] = 86400.0
    poll_interval_seconds: Annotated[
        float,
        Knob(
            "poll_interval",
            DURATION,
            "How often a running lease is observed; each "
            "observation is a cloud API call, so raise it for large fleets.",
            _JOB,
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            aliases=("poll_interval_seconds",),
            controller=True,
        ),
    ] = 1.0
    heartbeat_timeout_seconds: Annotated[
        float,
        Knob(
            "heartbeat_timeout",
            DURATION,
            "How long a lease outlives a silent driver: the "
            "node stops the step (after an emergency save) and ends the lease when the "
            "driver's heartbeat is older than this; 5m rides out a driver restart but leaks "
            "little capacity when a driver is killed.",
            _JOB,
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            controller=True,
        ),
    ] = 300.0
    heartbeat_uri: Annotated[
        str | None,
        Knob(
            "heartbeat_uri",
            TEXT,
            "A store every node can read (s3://bucket/prefix or "
            "file:///path) where each driver process (a triggerer, a Prefect worker, "
            "`spot-pipelines run`) keeps one heartbeat for all the jobs it watches: one write "
            "per renewal instead of one per job (1,000 deferred jobs: one S3 PUT every 75s "
            "instead of 1,000). Empty: each job's heartbeat lives in its own checkpoint store.",
            _JOB,
            optional=True,
            check=_check_store_uri,
            metavar="URI",
            controller=True,
        ),
    ] = None
    take_over: Annotated[
        bool,
        Knob(
            "take_over",
            BOOL,
            "Launch even though another driver (a second `run`, a worker or "
            "triggerer) renewed the job's heartbeat within its heartbeat_timeout. Without it "
            "such a driver is refused in one line naming the other one: two live drivers of "
            "one job would fence each other out and run two steps at once. Set it once, after "
            "the other driver is gone (killed, its machine lost), instead of waiting out the "
            "timeout.",
            _JOB,
            controller=True,
        ),
    ] = False
    handover: Annotated[
        str | None,
        Knob(
            "handover",
            TEXT,
            "When the replacement of a reclaimed attempt is launched: `on_notice` at the "
            "interruption notice (it boots and prefetches the newest checkpoint while the old "
            "attempt saves, then restores from that attempt's emergency checkpoint), "
            "`on_rebalance` at an earlier rebalance recommendation where the provider reports "
            "one, `off` once the old lease has ended. Empty: `on_notice` where the provider "
            "can launch in parallel, `off` elsewhere.",
            _JOB,
            optional=True,
            choices=HANDOVER_MODES,
            controller=True,
        ),
    ] = None
    observe_failure_timeout_seconds: Annotated[
        float,
        Knob(
            "observe_failure_timeout",
            DURATION,
            "How long observing a lease may keep failing "
            "(API errors, resets) before the attempt ends as infrastructure_failed and its "
            "lease is terminated; 3m outlasts a transient cloud API outage.",
            _JOB,
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            controller=True,
        ),
    ] = 180.0
    checkpoint_cost_seconds: Annotated[
        float,
        Knob(
            "checkpoint_cost",
            DURATION,
            "What one checkpoint save is taken to cost until the "
            "job's own saves have been measured (their mean is used after). With the pool's "
            "interruption rate it sets the Young/Daly interval each attempt is given in "
            "SPOT_CHECKPOINT_INTERVAL.",
            frozenset({CLI}),
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            controller=True,
        ),
    ] = 60.0
    checkpoint_interval_min_seconds: Annotated[
        float,
        Knob(
            "checkpoint_interval_min",
            DURATION,
            "Shortest time-based checkpoint interval an "
            "attempt is given, however often its pool is interrupted: 1m keeps a burst of "
            "interruptions from making the step spend its time saving.",
            frozenset({CLI}),
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            controller=True,
        ),
    ] = 60.0
    checkpoint_interval_max_seconds: Annotated[
        float,
        Knob(
            "checkpoint_interval_max",
            DURATION,
            "Longest time-based checkpoint interval an "
            "attempt is given (on-demand, or a pool never seen interrupted): the most work a "
            "missed notice may cost.",
            frozenset({CLI}),
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            controller=True,
        ),
    ] = 3600.0
    alert_interruption_rate: Annotated[
        float | None,
        Knob(
            "alert_interruption_rate",
            NUMBER,
            "Raise a pool alert (the Prefect event "
            "`spot.pool.alert`, the Airflow listener hook `on_spot_alert`) when a spot pool's "
            "observed interruptions per hour pass this; 0.25 (one every 4 h) is where restarts "
            "start to eat the savings of a long step. Empty: no rate alert.",
            frozenset({OPERATOR, BLOCK, WORKER}),
            unit="per hour",
            minimum=0,
            maximum=MAX_RATE,
            strict=True,
            optional=True,
        ),
    ] = 0.25
    alert_spot_price: Annotated[
        float | None,
        Knob(
            "alert_spot_price",
            NUMBER,
            "Raise a pool alert when a spot pool's price passes "
            "this. Empty: no price alert (prices differ by instance type).",
            frozenset({OPERATOR, BLOCK, WORKER}),
            unit="USD/h",
            minimum=0,
            maximum=MAX_PRICE,
            strict=True,
            optional=True,
        ),
    ] = None
    checkpoint_every_seconds: Annotated[
        float | None,
        Knob(
            "checkpoint_every",
            DURATION,
            "Save a checkpoint at most this often (time based). "
            "Empty: only by steps and on an interruption notice.",
            _IN_PLACE,
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            optional=True,
            aliases=("checkpoint_every_seconds",),
        ),
    ] = None
    checkpoint_every_steps: Annotated[
        int | None,
        Knob(
            "checkpoint_every_steps",
            INT,
            "Save a checkpoint every this many steps. Empty: "
            "only by time and on an interruption notice.",
            _IN_PLACE,
            minimum=1,
            maximum=MAX_STEPS,
            optional=True,
        ),
    ] = None
    keep_checkpoints: Annotated[
        int,
        Knob(
            "keep_checkpoints",
            INT,
            "Checkpoints kept in the store (older ones are pruned); "
            "more than one survives a corrupt newest one.",
            frozenset({DECORATOR}),
            minimum=1,
            maximum=MAX_KEEP,
        ),
    ] = 3
    notice_poll_interval_seconds: Annotated[
        float,
        Knob(
            "notice_poll_interval",
            DURATION,
            "How often the node's metadata service is polled "
            "for an interruption notice; 1s leaves nearly all of a 2-minute notice for the "
            "emergency save.",
            frozenset({DECORATOR, SPOT_TASK}),
            minimum=0,
            maximum=MAX_WAIT,
            strict=True,
            aliases=("watch_poll_interval",),
        ),
    ] = 1.0
    cloud: Annotated[
        str,
        Knob(
            "cloud",
            TEXT,
            "Where interruption notices come from: `auto` probes, or one of the "
            "notice detectors (`aws`, `gcp`, `azure`, `kubernetes`, `signal` (SIGTERM only); "
            "`spot-pipelines providers` lists them).",
            frozenset({DECORATOR}),
            choices=_cloud_choices,
        ),
    ] = "auto"
    work_capacity_seconds: Annotated[
        float | None,
        Knob(
            "work",
            DURATION,
            "With a deadline: compute the job needs, in capacity time like "
            "the deadline; the job moves to on-demand when work left plus two restarts no "
            "longer fits on spot.",
            _JOB,
            minimum=0,
            maximum=MAX_SPAN,
            why_maximum=WHY_SPAN,
            strict=True,
            optional=True,
        ),
    ] = None
    total_steps: Annotated[
        int | None,
        Knob(
            "total_steps",
            INT,
            "With work: the step count at which the job is done, so "
            "checkpoint steps measure progress.",
            _JOB,
            minimum=1,
            maximum=MAX_STEPS,
            optional=True,
        ),
    ] = None
    restart_overhead_capacity_seconds: Annotated[
        float,
        Knob(
            "restart_overhead",
            DURATION,
            "With work: capacity time a new instance takes before "
            "the job makes progress again (5m covers boot, image pull and restore).",
            _JOB,
            minimum=0,
            maximum=MAX_WAIT,
        ),
    ] = 300.0
    deadline_policy: Annotated[
        str | None,
        Knob(
            "deadline_policy",
            TEXT,
            "With a deadline and work: the deadline policy (greedy, "
            "uniform-progress, default, ...) that decides spot, on-demand or wait between "
            "attempts on a trace market (the local cloud). Empty: only the on-demand safety "
            "net.",
            _JOB,
            optional=True,
            choices=_deadline_policy_choices,
        ),
    ] = None

    def __post_init__(self) -> None:
        for knob_ in KNOBS:
            object.__setattr__(self, knob_.field, knob_.parse(getattr(self, knob_.field)))
        self._settle_deadline()
        work, deadline = self.work_capacity_seconds, self.deadline_capacity_seconds
        if work is not None and deadline is None and self.deadline_at is None:
            raise ConfigError(
                f"work={format_duration(work)} needs deadline=DURATION too "
                "(the work is planned against it); set one, or drop work"
            )
        if work is not None and deadline is not None:
            _check_work_fits(work, deadline)
        if self.deadline_policy is not None and work is None:
            raise ConfigError(
                f"deadline_policy={self.deadline_policy!r} needs deadline and "
                "work (and total_steps, so checkpoints measure progress)"
            )

    def _settle_deadline(self) -> None:
        """The ``deadline`` knob holds a duration or a time: a time given as the duration
        (what ``build`` passes on) goes to ``deadline_at``; never both."""
        deadline = KNOBS_BY_NAME["deadline"]
        duration, when = self.deadline_capacity_seconds, self.deadline_at
        if when is not None:
            when = deadline.parse(when)
            if not isinstance(when, datetime):
                raise ConfigError(
                    f"deadline_at={self.deadline_at!r} is not a time; give a "
                    "datetime or an ISO time such as 2026-12-01T08:00Z"
                )
        if isinstance(duration, datetime):
            duration, when = None, duration if when is None else _both_deadlines()
        if duration is not None and when is not None:
            _both_deadlines()
        object.__setattr__(self, "deadline_capacity_seconds", duration)
        object.__setattr__(self, "deadline_at", when)

    def check_provider_options(self) -> None:
        """The provider registry's check of ``provider_options`` (no cloud call)."""
        from spot_core.providers.registry import check_provider

        check_provider(self.provider, self.provider_options, self.instance_types)

    @classmethod
    def build(cls, *, where: str = "", check_options: bool = True, **values: Any) -> "SpotSettings":
        """Settings from keyword values under the surfaces' names (old names allowed);
        errors are one line, prefixed with ``where`` (a task id, a block, a flag set) so
        the user knows what to fix.

        ``check_options``: also check ``provider_options`` against the provider (off for
        the CLI, whose provider options come from its own flags)."""
        values = resolve_aliases(values, where=where)
        unknown = sorted(set(values) - set(KNOBS_BY_NAME))
        if unknown:
            raise ConfigError(
                f"{_prefix(where)}unknown setting(s) {unknown}; choose from {sorted(KNOBS_BY_NAME)}"
            )
        try:
            settings = cls(**{KNOBS_BY_NAME[name].field: value for name, value in values.items()})
            if check_options:
                settings.check_provider_options()
            return settings
        except ConfigError as exc:
            raise ConfigError(f"{_prefix(where)}{exc}") from None

    def replace(self, **values: Any) -> "SpotSettings":
        """These settings with some knobs changed (the surfaces' names)."""
        return type(self).build(**{**self.knob_values(), **values})

    def knob_values(self, *, controller_only: bool = False) -> dict[str, Any]:
        """Knob name -> value as the surfaces show it (``controller_only``: the bounds of
        the controller's lifecycle, which a trigger carries to the triggerer)."""
        return {k.name: k.read(self) for k in KNOBS if k.controller or not controller_only}

    def policy_knob_values(self) -> dict[str, Any]:
        """Knob name -> value of the retry policy's knobs (its budgets, fallback, waits,
        price cap): what a driver that did not build the job needs for the policy to
        decide its next attempt as the launching driver would (a trigger handing over)."""
        return {k.name: k.read(self) for k in KNOBS if k.field in POLICY_FIELDS}

    def retry_policy(
        self, *, max_user_retries: int | None = None, deadline_safety_seconds: float = 0.0
    ) -> RetryPolicy:
        """The pure policy's input. ``max_user_retries``: an engine passes its own (its
        retries are the user-failure budget), the CLI uses the setting."""
        return RetryPolicy(
            max_preemptions=self.max_preemptions,
            max_user_retries=self.max_user_retries
            if max_user_retries is None
            else max_user_retries,
            max_infrastructure_retries=self.max_infrastructure_retries,
            max_disruptions=self.max_disruptions,
            on_demand_fallback=self.on_demand_fallback,
            return_to_spot=self.return_to_spot,
            capacity_wait_seconds=self.capacity_wait_seconds,
            max_capacity_waits=self.max_capacity_waits,
            deadline_safety_seconds=deadline_safety_seconds,
            min_on_demand_seconds=self.min_on_demand_seconds,
            max_spot_price=self.max_spot_price,
        )

    def controller_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Controller``: the lifecycle's bounds, in seconds (each
        knob marked ``controller``, under its field's name)."""
        return {k.field: getattr(self, k.field) for k in KNOBS if k.controller}

    def deadline_spec(self, *, created_at: float, capacity_per_wall: float) -> dict[str, Any]:
        """JobSpec's deadline fields (``deadline_at`` wall-clock POSIX time,
        ``work_capacity_seconds`` and ``restart_overhead_capacity_seconds``,
        ``total_steps``, ``deadline_policy``) under the time convention; every surface
        builds its JobSpec with these, ``created_at`` being its JobRecord's (so a resumed
        job keeps its deadline) and ``capacity_per_wall`` its provider's
        ``capacity_seconds(1.0)``."""
        deadline = self.deadline_at or self.deadline_capacity_seconds
        deadline_at = wall_deadline(
            deadline, created_at=created_at, capacity_per_wall=capacity_per_wall
        )
        if self.work_capacity_seconds is not None and self.deadline_at is not None:
            assert deadline_at is not None
            _check_work_fits(
                self.work_capacity_seconds,
                (deadline_at - created_at) * capacity_per_wall,
                deadline=self.deadline_at.isoformat(),
            )
        return {
            "deadline_at": deadline_at,
            "work_capacity_seconds": self.work_capacity_seconds,
            "total_steps": self.total_steps,
            "restart_overhead_capacity_seconds": self.restart_overhead_capacity_seconds,
            "deadline_policy": self.deadline_policy,
        }

    def alert_thresholds(self) -> dict[str, float | None]:
        """Keyword arguments for ``spot_core.policy.alerts.pool_alerts``."""
        return {
            "max_interruption_rate": self.alert_interruption_rate,
            "max_spot_price": self.alert_spot_price,
        }

    def checkpointer_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Checkpointer`` (its schedule and how many it keeps)."""
        return {
            "every_seconds": self.checkpoint_every_seconds,
            "every_steps": self.checkpoint_every_steps,
            "keep": self.keep_checkpoints,
        }


def _bind() -> tuple[Knob, ...]:
    """Each field's ``Knob``, bound to its field's name and default, in field order."""
    hints = get_type_hints(SpotSettings, include_extras=True)
    bound = []
    for spec in fields(SpotSettings):
        found = [m for m in getattr(hints[spec.name], "__metadata__", ()) if isinstance(m, Knob)]
        if not found:
            continue
        default = (
            spec.default_factory()
            if spec.default_factory is not dataclasses.MISSING
            else spec.default
        )
        bound.append(dataclasses.replace(found[0], field=spec.name, default=default))
    return tuple(bound)


def _both_deadlines() -> NoReturn:
    raise ConfigError(
        "deadline is a duration or a time, not both: give deadline_capacity_seconds or deadline_at"
    )


KNOBS: tuple[Knob, ...] = _bind()
KNOBS_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
ALIASES: dict[str, str] = {alias: k.name for k in KNOBS for alias in k.aliases}


def knob(name: str) -> Knob:
    return KNOBS_BY_NAME[name]


def default(name: str) -> Any:
    """The model's default for knob ``name`` (a fresh copy for mutable ones)."""
    value = KNOBS_BY_NAME[name].default
    return dict(value) if isinstance(value, dict) else value


def knobs_for(surface: str) -> tuple[Knob, ...]:
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; one of {SURFACES}")
    return tuple(k for k in KNOBS if surface in k.surfaces)


def resolve_aliases(values: dict[str, Any], *, where: str = "") -> dict[str, Any]:
    """``values`` with deprecated names renamed (a DeprecationWarning each); a value given
    under both names is refused."""
    out = dict(values)
    for alias, name in ALIASES.items():
        if alias not in out:
            continue
        if name in out:
            raise ConfigError(
                f"{_prefix(where)}{alias} is the old name of {name}; pass only {name}"
            )
        hint = (
            " (seconds, a timedelta or a string such as '5m')"
            if KNOBS_BY_NAME[name].kind == DURATION
            else ""
        )
        warnings.warn(
            f"{_prefix(where)}{alias} is deprecated; use {name}{hint}",
            DeprecationWarning,
            stacklevel=3,
        )
        out[name] = out.pop(alias)
    return out


def pop_aliases(kwargs: dict[str, Any], *, where: str = "") -> dict[str, Any]:
    """Remove deprecated names from ``kwargs`` (in place) and return them under the new
    names, for callables that pass ``**kwargs`` on to a base class."""
    found = {alias: kwargs.pop(alias) for alias in list(kwargs) if alias in ALIASES}
    return resolve_aliases(found, where=where)


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def _check_work_fits(work: float, room: float, *, deadline: str | None = None) -> None:
    """A job whose work exceeds the capacity time before its deadline cannot finish even
    on on-demand: refused before anything runs, rather than failing at the deadline."""
    if work <= room:
        return
    shown = format_duration(room) if deadline is None else deadline
    extra = (
        "" if deadline is None else f" ({format_duration(max(round(room), 0))} of capacity time)"
    )
    raise ConfigError(
        f"work={format_duration(work)} is more than deadline={shown}{extra}: "
        "the job cannot finish in time even on on-demand; give a later "
        "deadline or less work"
    )


__all__ = [
    "ALIASES",
    "BLOCK",
    "CLI",
    "DECORATOR",
    "KNOBS",
    "KNOBS_BY_NAME",
    "Knob",
    "OPERATOR",
    "POD_OPERATOR",
    "SPOT_TASK",
    "SURFACES",
    "SpotSettings",
    "TASK_RUNNER",
    "WORKER",
    "default",
    "format_duration",
    "knob",
    "knobs_for",
    "parse_duration",
    "parse_time",
    "pop_aliases",
    "resolve_aliases",
    "wall_deadline",
]
