"""A spot cloud on this machine, driven by real availability traces.

Each instance is a real process (the step under ``spot-pipelines watch``) with its own
metadata emulator. A monitor thread replays the trace: when an instance's spot pool
turns unavailable, the emulator starts serving the interruption notice; when the notice
period has passed, every process of the instance gets SIGTERM, and SIGKILL after a grace
period, as a reclaimed VM would. Launching into a pool that is unavailable at that
moment fails with ``CapacityUnavailable``; on-demand pools are always available.

Traces are replayed faster than real time (``market.time_scale`` trace seconds per wall
second), so notice periods are scaled too, with a floor that still lets a step save.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spot_core.errors import CapacityUnavailable, ConfigError
from spot_core.localcloud.lease_processes import LEASE_MARKER, signal_lease
from spot_core.localcloud.metadata import MetadataEmulator
from spot_core.market.fixtures import default_traces
from spot_core.market.trace import ZoneTrace
from spot_core.market.trace_market import TraceMarket
from spot_core.model import Pool

log = logging.getLogger(__name__)

# What each cloud promises between notice and reclaim, in capacity (trace) seconds.
NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
LOG_TAIL_BYTES = 256 * 1024  # what a log tail reads at most, from the end of the log
DEFAULT_TIME_SCALE = 3600.0  # one trace hour per wall second
EMULATED_CLOUDS = {"aws": "aws", "gcp": "gcp", "gce": "gcp", "azure": "azure"}
INSTANCE_PREFIX = "i-local-"
# In a lease's command, the Python of the machine the lease runs on (the cloud's own):
# a client in another container or virtual environment names it without knowing its path.
HOST_PYTHON = "@python"


@dataclass(frozen=True)
class LocalCloudConfig:
    min_notice_wall_seconds: float = 1.0  # floor for the scaled notice period
    grace_wall_seconds: float = 2.0  # SIGTERM -> SIGKILL at reclaim
    monitor_interval: float = 0.02  # how often the trace is checked

    def __post_init__(self) -> None:
        for name in ("min_notice_wall_seconds", "grace_wall_seconds", "monitor_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"LocalCloudConfig.{name} must be > 0, got {getattr(self, name)!r}"
                )


@dataclass(frozen=True)
class InstanceView:
    """What `describe` says of one instance."""

    instance_id: str
    running: bool
    exit_code: int | None
    notice_at: float | None
    ended_at: float | None
    reclaimed: bool
    terminated: bool
    # When the served notice's period ends and the capacity is taken (None: no notice).
    reclaim_at: float | None = None


class LocalCloud(Protocol):
    """The face the local provider and server use: a ``LocalSpotCloud`` in this process,
    or a ``RemoteLocalCloud`` talking to a server that holds one."""

    @property
    def market(self) -> TraceMarket: ...

    @property
    def workdir(self) -> Path: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def run_instance(
        self, pool: Pool, command: Sequence[str], env: Mapping[str, str], endpoint_env: str
    ) -> InstanceView: ...

    def describe(self, instance_ids: Sequence[str]) -> dict[str, InstanceView]: ...

    def terminate_instance(self, instance_id: str) -> None: ...

    def log_tail(self, instance_id: str, lines: int = 5) -> str: ...

    def shutdown(self) -> None: ...


@dataclass
class _Instance:
    instance_id: str
    pool: Pool
    process: subprocess.Popen[bytes]
    emulator: MetadataEmulator
    log_path: Path
    launched_at: float
    notice_at: float | None = None
    reclaim_at: float | None = None
    kill_at: float | None = None
    swept: bool = False
    reclaimed: bool = False
    terminated: bool = False
    ended_at: float | None = None
    exit_code: int | None = None

    def view(self) -> InstanceView:
        return InstanceView(
            self.instance_id,
            self.ended_at is None,
            self.exit_code,
            self.notice_at,
            self.ended_at,
            self.reclaimed,
            self.terminated,
            self.reclaim_at,
        )


@dataclass
class LocalSpotCloud:
    """Runs instances as local processes and reclaims spot ones as the trace says."""

    market: TraceMarket
    workdir: Path
    config: LocalCloudConfig = field(default_factory=LocalCloudConfig)
    clock: Callable[[], float] = time.time
    owns_workdir: bool = False  # a temp folder this cloud made, so it removes it too

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # shutdown() removes it; the finalizer covers a cloud that is only garbage
        # collected or alive at interpreter exit, so no run leaves a temp folder behind.
        self._remove_workdir = (
            weakref.finalize(self, shutil.rmtree, str(self.workdir), True)
            if self.owns_workdir
            else None
        )
        self._instances: dict[str, _Instance] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

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
    ) -> LocalSpotCloud:
        """A cloud replaying ``traces`` (default: the shipped excerpt) from ``start_tick`` now.

        Lives here, not in the provider, so the server builds its cloud without importing
        the provider that is its client."""
        traces = list(traces) if traces is not None else default_traces()
        ticks = min(t.n_ticks for t in traces) if traces else 0
        if (
            isinstance(start_tick, bool)
            or not isinstance(start_tick, int)
            or not 0 <= start_tick < max(ticks, 1)
        ):
            raise ConfigError(
                f"start_tick={start_tick!r} must be a whole tick from 0 to "
                f"{ticks - 1} (the traces have {ticks} ticks)"
            )
        origin = clock() - start_tick * traces[0].tick_seconds / time_scale
        market = TraceMarket(traces, tick_origin=origin, time_scale=time_scale)
        owns = not workdir
        workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="spot-local-cloud-"))
        return cls(
            market=market,
            workdir=workdir,
            config=config or LocalCloudConfig(),
            clock=clock,
            owns_workdir=owns,
        )

    # -- the "API" ------------------------------------------------------------------------
    def run_instance(
        self, pool: Pool, command: Sequence[str], env: Mapping[str, str], endpoint_env: str
    ) -> InstanceView:
        """Start ``command`` on new capacity in ``pool``; ``endpoint_env`` names the
        variable that receives the instance's metadata endpoint URL. ``HOST_PYTHON`` in
        ``command`` is this machine's Python."""
        command = [sys.executable if part == HOST_PYTHON else part for part in command]
        now = self.clock()
        if pool.is_spot and not self.market.is_available(pool.zone, now):
            raise CapacityUnavailable(
                f"no spot capacity in {pool.key} at trace tick "
                f"{self.market.tick_at(now)} (InsufficientInstanceCapacity)"
            )
        instance_id = f"{INSTANCE_PREFIX}{uuid.uuid4().hex[:12]}"
        emulator = MetadataEmulator(
            clouds=(self._emulated_cloud(pool),),
            zone=pool.zone,
            instance_id=instance_id,
            instance_type=pool.instance_type,
        )
        emulator.start()
        log_path = self.workdir / f"{instance_id}.log"
        full_env = {**env, endpoint_env: emulator.url, LEASE_MARKER: instance_id}
        try:
            with open(log_path, "wb") as log_file:
                process = subprocess.Popen(
                    list(command),
                    env=full_env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except BaseException:
            emulator.stop()
            raise
        instance = _Instance(instance_id, pool, process, emulator, log_path, now)
        with self._lock:
            self._instances[instance_id] = instance
        self._ensure_monitor()
        return instance.view()

    def describe(self, instance_ids: Sequence[str]) -> dict[str, InstanceView]:
        with self._lock:
            self._refresh()
            return {i: self._instances[i].view() for i in instance_ids if i in self._instances}

    def terminate_instance(self, instance_id: str) -> None:
        """Stop the instance's processes (SIGTERM, then SIGKILL) and its emulator."""
        with self._lock:
            instance = self._instances.get(instance_id)
        if instance is None:
            return
        if instance.ended_at is None:
            instance.terminated = True
            self._signal(instance, signal.SIGTERM)
            try:
                instance.process.wait(timeout=self.config.grace_wall_seconds)
            except subprocess.TimeoutExpired:
                pass
        self._signal(instance, signal.SIGKILL)  # stragglers that left the watcher behind
        self._reap(instance)
        instance.emulator.stop()

    def metadata_emulator(self, instance_id: str) -> MetadataEmulator:
        """The instance's own metadata service, for tests that make it misbehave (5xx,
        revoked tokens, garbage, hangs) the way a real node's IMDS can."""
        with self._lock:
            instance = self._instances.get(instance_id)
        if instance is None:
            raise KeyError(f"no instance {instance_id} in this local cloud")
        return instance.emulator

    def log_tail(self, instance_id: str, lines: int = 5) -> str:
        """The last ``lines`` lines of the instance's log, from at most its last
        ``LOG_TAIL_BYTES`` (a step may log gigabytes)."""
        instance = self._instances.get(instance_id)
        if instance is None or lines <= 0 or not instance.log_path.exists():
            return ""
        with open(instance.log_path, "rb") as log_file:
            log_file.seek(max(0, os.fstat(log_file.fileno()).st_size - LOG_TAIL_BYTES))
            text = log_file.read(LOG_TAIL_BYTES).decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def shutdown(self) -> None:
        """Terminate every instance this cloud ever started; stop the monitor; remove the
        temp folder if this cloud made it."""
        self._stop.set()
        for instance_id in list(self._instances):
            self.terminate_instance(instance_id)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        if self._remove_workdir is not None:
            self._remove_workdir()  # instance logs go with it; their tails are in the record

    # -- the trace replay ------------------------------------------------------------------
    def _ensure_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(
                target=self._run_monitor, daemon=True, name="local-spot-cloud"
            )
            self._monitor.start()

    def _run_monitor(self) -> None:
        while not self._stop.wait(self.config.monitor_interval):
            with self._lock:
                try:
                    self._refresh()
                except Exception:  # the monitor must outlive any one bad instance
                    log.exception("local spot cloud monitor failed on one round")

    def _refresh(self) -> None:
        now = self.clock()
        for instance in self._instances.values():
            self._reap(instance)
            if instance.ended_at is None or (instance.notice_at is not None and not instance.swept):
                self._advance(instance, now)
            if instance.kill_at is not None and now >= instance.kill_at and not instance.swept:
                # The node is gone: nothing that ran on it survives, exited lease or not.
                self._signal(instance, signal.SIGKILL)
                instance.swept = True

    def _advance(self, instance: _Instance, now: float) -> None:
        """Move a live spot instance along notice -> SIGTERM -> SIGKILL as the trace says."""
        if not instance.pool.is_spot or instance.terminated:
            return
        if instance.notice_at is None and not self.market.is_available(instance.pool.zone, now):
            wall_notice = self._wall_notice(instance.pool)
            instance.emulator.schedule_interruption(at=now, notice_seconds=wall_notice)
            instance.notice_at, instance.reclaim_at = now, now + wall_notice
            log.info(
                "%s: capacity reclaimed in %s; notice served",
                instance.instance_id,
                instance.pool.key,
            )
        elif (
            instance.reclaim_at is not None
            and now >= instance.reclaim_at
            and instance.kill_at is None
        ):
            instance.reclaimed = instance.ended_at is None  # it was still running when taken
            instance.kill_at = now + self.config.grace_wall_seconds
            self._signal(instance, signal.SIGTERM)

    def _wall_notice(self, pool: Pool) -> float:
        capacity_notice = NOTICE_SECONDS.get(self._emulated_cloud(pool), 120.0)
        return max(capacity_notice / self.market.time_scale, self.config.min_notice_wall_seconds)

    @staticmethod
    def _emulated_cloud(pool: Pool) -> str:
        return EMULATED_CLOUDS.get(pool.cloud, "aws")

    def _reap(self, instance: _Instance) -> None:
        if instance.ended_at is None and instance.process.poll() is not None:
            instance.exit_code = instance.process.returncode
            instance.ended_at = self.clock()

    @staticmethod
    def _signal(instance: _Instance, signum: int) -> None:
        # The main pid only while unreaped: a reaped pid may already belong to someone else.
        own = (instance.process.pid,) if instance.process.poll() is None else ()
        signal_lease(instance.instance_id, signum, extra_pids=own)
