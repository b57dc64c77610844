"""The local provider: leases on the trace-driven local spot cloud (no cloud account).

It is to ``LocalSpotCloud`` what the EC2 provider is to the EC2 API: it wraps the step in
``spot-pipelines watch`` (as EC2 user-data does), tells it about its attempt through
environment variables, turns instance state into lease status, and bills each lease
from the trace's prices over the capacity time it held.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spot_core import container
from spot_core.attempt_env import (
    DRIVER_LOST_EXIT_CODE,
    METADATA_ENDPOINT,
    AttemptEnv,
    readable_reason,
)
from spot_core.bounds import MAX_TIME_SCALE, MAX_WAIT_SECONDS
from spot_core.errors import ConfigError
from spot_core.localcloud.cloud import (
    DEFAULT_TIME_SCALE,
    EMULATED_CLOUDS,
    HOST_PYTHON,
    INSTANCE_PREFIX,
    InstanceView,
    LocalCloud,
    LocalCloudConfig,
    LocalSpotCloud,
)
from spot_core.localcloud.lease_processes import lease_pids, live_leases, signal_lease
from spot_core.market.trace import ZoneTrace
from spot_core.model import MAX_PRICE_PER_HOUR, Lease, Pool
from spot_core.providers.base import (
    Bill,
    Capability,
    LaunchSpec,
    LeaseState,
    LeaseStatus,
    Provider,
    ProviderPlugin,
)

log = logging.getLogger(__name__)

LOCAL_CLOUD_URL = "SPOT_LOCAL_CLOUD_URL"
WATCH_POLL_INTERVAL = 0.1  # a compressed trace's notice can be a second of wall time
DRIVER_LOST_MESSAGE = (
    "the lease ended itself: its driver stopped renewing the heartbeat "
    "for longer than the heartbeat timeout (killed or lost)"
)


class LocalProvider:
    """Provider protocol over a ``LocalSpotCloud``."""

    name = "local"
    capabilities = (
        Capability.SPOT
        | Capability.ON_THIS_MACHINE
        | Capability.CLEANUP_ORPHANS
        | Capability.IMAGES
        | Capability.TRACE_CLOCK
        | Capability.PARALLEL_LAUNCH
    )

    def __init__(
        self,
        cloud: LocalCloud,
        *,
        watch_poll_interval: float = WATCH_POLL_INTERVAL,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.cloud = cloud
        self.market = cloud.market
        self._watch_poll = watch_poll_interval
        # JSON-able: `open_provider("local", **options)` reopens this provider elsewhere
        # (with its watchers' poll interval, when not the default).
        self.options = dict(options or {})
        if watch_poll_interval != WATCH_POLL_INTERVAL:
            self.options["watch_poll_interval"] = watch_poll_interval

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        workdir: str | Path | None = None,
        token: str | None = None,
        watch_poll_interval: float = WATCH_POLL_INTERVAL,
    ) -> LocalProvider:
        """A provider over a running local cloud server (leases outlive this process).

        Its token comes from ``token``, else the server's ``workdir`` (its token file),
        else ``$SPOT_LOCAL_CLOUD_TOKEN``. The reopen ``options`` name the URL and the workdir, never
        the token: they travel in trigger kwargs and job variables, which are logged."""
        from spot_core.localcloud.client import RemoteLocalCloud

        options = {"url": url} if workdir is None else {"url": url, "workdir": str(workdir)}
        return cls(
            RemoteLocalCloud(url, token=token, workdir=workdir),
            options=options,
            watch_poll_interval=watch_poll_interval,
        )

    @classmethod
    def from_options(
        cls,
        *,
        url: str | None = None,
        traces: Sequence[str] | None = None,
        prices: str | None = None,
        time_scale: float = DEFAULT_TIME_SCALE,
        start_tick: int = 0,
        workdir: str | None = None,
        watch_poll_interval: float = WATCH_POLL_INTERVAL,
        on_demand_price: float | None = None,
    ) -> LocalProvider:
        """From plain options: a server's ``url`` (or ``$SPOT_LOCAL_CLOUD_URL``; its token
        from the server's ``workdir`` or ``$SPOT_LOCAL_CLOUD_TOKEN``), else a cloud in this
        process replaying ``traces`` (paths; default the shipped excerpt) in ``workdir``.
        ``watch_poll_interval``: how often each lease's watcher polls its metadata endpoint,
        in seconds (default 0.1, for a compressed trace whose notice may last a second of
        wall time; about 1 at ``time_scale`` 1, a fifth of the watcher's cost).
        ``on_demand_price``: $/h of on-demand capacity for traces that carry none (a CSV
        trace of another instance type than the shipped V100s').
        """
        url = url or os.environ.get(LOCAL_CLOUD_URL)
        if url:
            return cls.connect(url, workdir=workdir, watch_poll_interval=watch_poll_interval)
        from spot_core.market.trace import load_traces

        loaded = (
            None
            if not traces
            else load_traces(traces, prices=prices, on_demand_price=on_demand_price)
        )
        provider = cls.from_traces(
            loaded,
            time_scale=time_scale,
            start_tick=start_tick,
            workdir=workdir,
            watch_poll_interval=watch_poll_interval,
        )
        provider.options.update(
            {
                "traces": list(traces or []),
                "prices": prices,
                "time_scale": time_scale,
                "start_tick": start_tick,
                "workdir": str(provider.cloud.workdir),
            }
        )
        if on_demand_price is not None:
            provider.options["on_demand_price"] = on_demand_price
        return provider

    @classmethod
    def from_traces(
        cls,
        traces: Sequence[ZoneTrace] | None = None,
        *,
        time_scale: float = DEFAULT_TIME_SCALE,
        start_tick: int = 0,
        workdir: str | Path | None = None,
        config: LocalCloudConfig | None = None,
        clock: Callable[[], float] = time.time,
        watch_poll_interval: float = WATCH_POLL_INTERVAL,
    ) -> LocalProvider:
        """A cloud replaying ``traces`` (default: the shipped excerpt) from ``start_tick`` now."""
        return cls(
            LocalSpotCloud.from_traces(
                traces,
                time_scale=time_scale,
                start_tick=start_tick,
                workdir=workdir,
                config=config,
                clock=clock,
            ),
            watch_poll_interval=watch_poll_interval,
        )

    def pools(self) -> tuple[Pool, ...]:
        return self.market.pools()

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        cloud = EMULATED_CLOUDS.get(pool.cloud, "aws")
        step = spec.command
        if spec.image:
            container.require_engine()
            step = container.wrap(spec.image, spec.command, tuple(spec.env), python=HOST_PYTHON)
        # The watcher runs where the lease does: a server's leases in its own container.
        command = (
            HOST_PYTHON,
            "-m",
            "spot_core.cli",
            "watch",
            "--cloud",
            cloud,
            "--poll-interval",
            str(self._watch_poll),
            "--",
            *step,
        )
        attempt = AttemptEnv(
            checkpoint_uri=spec.checkpoint_uri,
            job_id=spec.job_id,
            attempt=spec.attempt,
            metadata_endpoint=None,
            cloud=cloud,
            notice_file=None,
            heartbeat_timeout=spec.heartbeat_timeout_seconds,
        )
        env = {**_inherited_env(), **spec.env, **attempt.to_environ()}
        view = self.cloud.run_instance(pool, command, env, endpoint_env=METADATA_ENDPOINT)
        price = self.market.offers([pool], self.cloud.clock())[0].price_per_hour
        return Lease(
            lease_id=view.instance_id,
            pool=pool,
            job_id=spec.job_id,
            attempt=spec.attempt,
            started_at=self.cloud.clock(),
            price_per_hour=price,
            details={
                "log": str(self.cloud.workdir / f"{view.instance_id}.log"),
                "tags": f"spot-pipelines:job={spec.job_id},attempt={spec.attempt}",
            },
        )

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        """One describe for all of them; a log tail only for a lease that ended with a
        non-zero exit (its message), so watching many running leases costs one call."""
        views = self.cloud.describe([lease.lease_id for lease in leases])
        return {
            lease_id: _status(view, self._tail_if_failed(lease_id, view))
            for lease_id, view in views.items()
        }

    def _tail_if_failed(self, lease_id: str, view: InstanceView) -> str:
        return "" if view.running or view.exit_code == 0 else self.cloud.log_tail(lease_id)

    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """Per-second billing at the trace's price of each tick the lease spanned."""
        capacity = self.capacity_seconds(max(0.0, ended_at - lease.started_at))
        on_demand = self.market.offers([lease.pool], lease.started_at)[0].on_demand_price_per_hour
        if not lease.pool.is_spot:
            cost = on_demand * capacity / 3600.0
        else:
            cost = self._spot_cost(lease.pool, lease.started_at, ended_at)
        return Bill(
            cost=cost, on_demand_cost=on_demand * capacity / 3600.0, capacity_seconds=capacity
        )

    def _spot_cost(self, pool: Pool, start: float, end: float) -> float:
        market, cost = self.market, 0.0
        for tick in range(market.tick_at(start), market.tick_at(end) + 1):
            low, high = max(start, market.wall_time(tick)), min(end, market.wall_time(tick + 1))
            if high > low:
                price = market.offers([pool], low)[0].price_per_hour
                cost += price * self.capacity_seconds(high - low) / 3600.0
        return cost

    def capacity_seconds(self, wall_seconds: float) -> float:
        return wall_seconds * self.market.time_scale

    def terminate(self, lease: Lease) -> None:
        self.cloud.terminate_instance(lease.lease_id)

    def cleanup_orphans(
        self, job_id: str | None = None, *, grace_seconds: float = 2.0
    ) -> list[str]:
        """End every local lease still running on this machine (of ``job_id`` only, if
        given) and return their ids: the local cloud's twin of the EC2 provider's.

        A lease whose driver died renews no heartbeat and ends itself once its heartbeat
        timeout passes; this finds the rest (a lease launched without a timeout, or one
        whose driver died before the first beat). A lease of this provider's cloud is
        terminated through it; a lease left by a dead process (found by its marker in
        ``/proc``) gets SIGTERM, then SIGKILL after ``grace_seconds``. Only for when no
        live job owns them: it does not ask."""
        orphans = sorted(live_leases(INSTANCE_PREFIX, job_id))
        known = set(self.cloud.describe(orphans)) if orphans else set()
        for lease_id in orphans:
            if lease_id in known:
                self.cloud.terminate_instance(lease_id)
            else:
                signal_lease(lease_id, signal.SIGTERM)
        give_up = time.monotonic() + grace_seconds
        while any(map(lease_pids, orphans)) and time.monotonic() < give_up:
            time.sleep(0.05)
        for lease_id in orphans:  # whatever outlived the grace, as a reclaimed node would
            signal_lease(lease_id, signal.SIGKILL)
        if orphans:
            log.warning("ended %d orphaned local lease(s): %s", len(orphans), ", ".join(orphans))
        return orphans

    def close(self) -> None:
        """In-process: terminate every lease. Over a server: nothing, since leases there
        outlive this process by design (each is terminated explicitly when its attempt ends)."""
        self.cloud.shutdown()

    def __enter__(self) -> LocalProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _status(view: InstanceView, log_tail: str) -> LeaseStatus:
    if view.running:
        return LeaseStatus(
            LeaseState.RUNNING,
            notice_at=view.notice_at,
            reclaim_at=getattr(view, "reclaim_at", None),
        )
    if view.exit_code == DRIVER_LOST_EXIT_CODE and not (view.reclaimed or view.terminated):
        # The watcher ended the lease itself: its driver stopped renewing the heartbeat.
        # Neither a reclaim nor the step's own failure; whoever reads this is a new driver.
        return LeaseStatus(
            LeaseState.TERMINATED,
            exit_code=view.exit_code,
            notice_at=view.notice_at,
            ended_at=view.ended_at,
            message=DRIVER_LOST_MESSAGE,
        )
    state = (
        LeaseState.TERMINATED
        if view.terminated and not view.reclaimed
        else LeaseState.RECLAIMED
        if view.reclaimed
        else LeaseState.EXITED
    )
    message = "" if view.exit_code == 0 else readable_reason(log_tail)
    return LeaseStatus(
        state,
        exit_code=view.exit_code,
        notice_at=view.notice_at,
        ended_at=view.ended_at,
        message=message,
    )


def _inherited_env() -> dict[str, str]:
    """The launching environment, minus anything that would confuse the step."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SPOT_")}


def new_job_id(prefix: str = "job") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the plugin: what the engines know of this provider -----------------------------------------
class LocalPlugin(ProviderPlugin):
    """The local spot cloud: leases are processes on this machine replaying real traces."""

    capabilities = LocalProvider.capabilities
    summary = "the trace-driven local spot cloud on this machine (no cloud account)"

    def open(self, options: Mapping[str, Any], session: Any = None) -> Provider:
        return LocalProvider.from_options(**options)

    def check_options(self, options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
        """Option names must be ``LocalProvider.from_options`` parameters, each of its type
        and range."""
        known = set(inspect.signature(LocalProvider.from_options).parameters) - {"cls"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(
                f"unknown local provider option(s) {unknown}; choose from {sorted(known)}"
            )
        for name, value in options.items():
            _check_option(name, value)

    def option_defaults(
        self,
        options: Mapping[str, Any],
        *,
        instance_types: Sequence[str] = (),
        session: Any = None,
        scratch_dir: str | None = None,
    ) -> dict[str, Any]:
        """An in-process cloud keeps its leases' files in the engine's scratch folder; a
        server's (``url``) in the server's own."""
        if options.get("url") or scratch_dir is None:
            return dict(options)
        return {"workdir": scratch_dir, **options}

    def add_cli_arguments(self, parser: Any) -> None:
        group = parser.add_argument_group("local provider (the local spot cloud)")
        group.add_argument(
            "--trace",
            action="append",
            type=Path,
            default=None,
            metavar="PATH",
            help="local provider: availability trace(s) to replay, one per "
            "zone (default: the shipped AWS V100 excerpt)",
        )
        group.add_argument(
            "--prices",
            type=Path,
            default=None,
            help="local provider: per-tick spot price file {zone: [...]} for CSV traces",
        )
        group.add_argument(
            "--on-demand-price",
            type=float,
            default=None,
            metavar="P",
            help="local provider: on-demand $/h for traces that carry none "
            "(default: the trace's, else 3.06 for the V100 traces)",
        )
        group.add_argument(
            "--time-scale",
            type=float,
            default=DEFAULT_TIME_SCALE,
            help="local provider: trace seconds per wall second (default "
            f"{DEFAULT_TIME_SCALE:g}: one trace hour per second)",
        )
        group.add_argument(
            "--start-tick",
            type=int,
            default=0,
            help="local provider: trace tick to start at (default 0)",
        )

    def cli_options(self, args: Any) -> dict[str, Any]:
        if not (math.isfinite(args.time_scale) and 0 < args.time_scale <= MAX_TIME_SCALE):
            raise ConfigError(
                f"--time-scale must be a finite number > 0 and at most "
                f"{MAX_TIME_SCALE:,.0f} (trace seconds per wall second), got "
                f"{args.time_scale}; e.g. --time-scale 3600"
            )
        price = args.on_demand_price
        if price is not None and not (math.isfinite(price) and 0 < price <= MAX_PRICE_PER_HOUR):
            raise ConfigError(
                f"--on-demand-price must be a finite $/h > 0 and at most "
                f"{MAX_PRICE_PER_HOUR:,.0f}, got {price}; e.g. "
                "--on-demand-price 3.06"
            )
        return {
            "traces": args.trace,
            "prices": args.prices,
            "on_demand_price": price,
            "time_scale": args.time_scale,
            "start_tick": args.start_tick,
        }

    def open_for_cli(self, args: Any, options: Mapping[str, Any]) -> Provider:
        """A cloud in this process (never a server's: ``run`` owns its leases) replaying
        ``--trace`` (default: the shipped excerpt) from ``--start-tick``."""
        from spot_core.market.fixtures import fixture_prices_path, fixture_trace_paths
        from spot_core.market.trace import load_traces
        from spot_core.market.trace_market import check_time_scale

        price = options["on_demand_price"]
        if options["traces"]:
            traces = load_traces(options["traces"], prices=options["prices"], on_demand_price=price)
        else:
            traces = load_traces(
                fixture_trace_paths(), prices=fixture_prices_path(), on_demand_price=price
            )
        check_time_scale(options["time_scale"], traces[0].tick_seconds, name="--time-scale")
        ticks = min(t.n_ticks for t in traces)
        start = options["start_tick"]
        if not 0 <= start < ticks:
            raise ConfigError(
                f"--start-tick {start} is outside the traces' {ticks} ticks; "
                f"give a tick from 0 to {ticks - 1}"
            )
        return LocalProvider.from_traces(traces, time_scale=options["time_scale"], start_tick=start)

    def pool_aliases(self, provider: Provider) -> dict[str, Pool]:
        """Each replayed trace's name (``us-east-2a_v100_1``) for the pool of its zone."""
        pools = provider.pools()
        return {
            trace.name: next(p for p in pools if p.zone == trace.zone)
            for trace in provider.market.traces
            if any(p.zone == trace.zone for p in pools)
        }


def _check_option(name: str, value: Any) -> None:
    """Each local option's type and range, so a bad one fails where it is written. A
    value still holding a template (``{{ ... }}``, Airflow's and Prefect's) is checked by
    the opener once rendered."""
    if value is None or (isinstance(value, str) and "{{" in value):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "time_scale" and not (
        number and math.isfinite(value) and 0 < value <= MAX_TIME_SCALE
    ):
        raise ConfigError(
            f"local provider option time_scale={value!r} must be a finite "
            f"number > 0 and at most {MAX_TIME_SCALE:,.0f} (trace seconds per "
            "wall second, e.g. 3600; the traces' tick may lower the bound)"
        )
    if name == "watch_poll_interval" and not (
        number and math.isfinite(value) and 0 < value <= MAX_WAIT_SECONDS
    ):
        raise ConfigError(
            f"local provider option watch_poll_interval={value!r} must be a "
            "finite number of seconds > 0 and at most 86400 (how often each "
            "lease's watcher polls its metadata endpoint, e.g. 1)"
        )
    if name == "start_tick" and not (number and isinstance(value, int) and value >= 0):
        raise ConfigError(
            f"local provider option start_tick={value!r} must be a whole "
            "number >= 0 (a row of the traces)"
        )
    if name == "on_demand_price" and not (
        number and math.isfinite(value) and 0 < value <= MAX_PRICE_PER_HOUR
    ):
        raise ConfigError(
            f"local provider option on_demand_price={value!r} must be a finite "
            f"$/h > 0 and at most {MAX_PRICE_PER_HOUR:,.0f} (the traces' "
            "on-demand price, e.g. 3.06)"
        )
    if name in ("url", "prices", "workdir") and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"local provider option {name}={value!r} must be a non-empty string")
    if name == "url" and not value.startswith(("http://", "https://")):
        raise ConfigError(
            f"local provider option url={value!r} must be the server's "
            "http:// URL, e.g. http://127.0.0.1:8765"
        )
    if name == "traces" and (
        isinstance(value, str)
        or not isinstance(value, (list, tuple))
        or not all(isinstance(t, str) and t.strip() for t in value)
    ):
        raise ConfigError(
            f"local provider option traces={value!r} must be a list of trace file paths"
        )
