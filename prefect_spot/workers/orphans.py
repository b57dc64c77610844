"""Flow runs a dead spot worker left ``Running``: found, so another worker adopts them.

A spot worker puts a preempted flow run back (``AwaitingRetry``) once its lease ended.
The node hands the run back first: the engine ends it without a state, as Prefect's
``relinquish`` intent asks ("leave the next state to retrying infrastructure"). If the
worker dies between the two, nobody sets the next state: Prefect's workers pick up only
scheduled runs, and the lease is gone, so its watcher cannot end the run either. The run
would stay ``Running`` for ever.

So every spot worker looks, every ``ORPHAN_CHECK_SECONDS``, at the ``Running`` flow runs
of its work pool that it does not drive itself, and adopts a run when all three hold:

- its record (the ``spot-record-<flow run id>`` artifact) has an attempt still open;
- the job's heartbeat, renewed by whichever worker drives the run (every quarter of the
  timeout; through its one beat for all its jobs with ``heartbeat_uri``),
  has not changed for the job's ``heartbeat_timeout``, judged as the node judges it
  (``spot_core.interruption.driver.Freshness``: the beat's sequence, on this worker's own
  monotonic clock, so no two machines' clocks are compared): no worker drives it;
- the open attempt's lease has ended: a lease that still runs is the node's to end (its
  watcher stops the step once the heartbeat is that old, and the run ends ``Failed``).

Adopting is driving the run from its record, as a worker restarted with it would: the
controller watches the open attempt, closes it from the lease's end (a reclaim is a
preemption), and the worker reschedules or settles the run as usual.

Several workers of a pool look at the same runs, so two can find the same orphan in the
same moment. Only one adopts it: each first *claims* the open attempt, a compare-and-swap
of ``adoption/attempt-<N>.json`` in the job's store (``CheckpointStore.swap_object``), and
the others leave the run alone. A claim whose adopter died before settling the run is
taken over once it has stood unchanged for the heartbeat timeout, judged on the taker's
own monotonic clock as the heartbeat is. The flow-run retries the adopted attempt's runs
used are given back as for any preemption (the adopter counts them from the run's
``Running`` states since its last ``Pending``).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread
from prefect.client.schemas.objects import FlowRun

from prefect_spot.artifacts import load_record, record_key
from spot_core.checkpoint.heartbeat import Heartbeat
from spot_core.controller import provider_stores
from spot_core.interruption.driver import Freshness
from spot_core.jobs import LeaseStatus
from spot_core.model import JobRecord

if TYPE_CHECKING:
    from prefect_spot.workers.configuration import SpotJobConfiguration

ORPHAN_CHECK_SECONDS = 30.0
"""How often a worker looks for orphaned runs (a read of its pool's Running runs)."""

CLAIM_KEY = "adoption/attempt-{:06d}.json"
"""The object in the job's store that names the one worker adopting its open attempt."""

ORPHAN_PAGE = 200
"""Running flow runs read per API call when looking for orphans."""


@dataclass(frozen=True)
class Evidence:
    """What an adoption is decided on, read by :func:`gather`."""

    record: JobRecord | None
    silent_for: float  # seconds this worker has seen no new heartbeat
    status: LeaseStatus | None


def orphaned(evidence: Evidence, heartbeat_timeout: float | None) -> str | None:
    """Why the run is an orphan to adopt, or None to leave it alone (pure)."""
    record = evidence.record
    if record is None or record.current_attempt is None or heartbeat_timeout is None:
        return None  # nothing open, or no heartbeat to tell a live driver by
    if evidence.silent_for < heartbeat_timeout:
        return None  # a worker drives it (or it has not been watched for long enough)
    status = evidence.status
    if status is None or not status.ended:
        return None  # the lease runs (or is unknown yet): the node's watcher ends it
    return (
        f"attempt {record.current_attempt.number} is open, its lease "
        f"{record.current_attempt.lease_id} has ended and its heartbeat has not "
        f"changed for {evidence.silent_for:.0f} s"
    )


def may_take(
    current: bytes | None, seen: tuple[bytes, float] | None, now: float, timeout: float
) -> bool:
    """Whether this worker may claim an orphan's open attempt (pure): nobody claims it, or
    the claim is the one this worker first saw ``timeout`` seconds ago (``seen``: its
    bytes and that moment on this worker's monotonic clock), so its adopter died."""
    if current is None:
        return True
    return seen is not None and seen[0] == current and now - seen[1] >= timeout


def gather(
    freshness: Freshness,
    checkpoint_uri: str,
    stores,
    heartbeat_timeout: float,
    now: float,
    read_record: Callable[[], JobRecord | None],
    provider,
    heartbeat_uri: str | None = None,
) -> Evidence:
    """Read the job's heartbeat into ``freshness`` and, only once it has been silent for
    the timeout, the record and its open attempt's lease status (blocking I/O: run in a
    thread). A run some worker drives costs one read (two when its worker keeps one beat
    for all its jobs at ``heartbeat_uri``: the job's pointer, then that beat)."""
    drivers = None if heartbeat_uri is None else stores(heartbeat_uri)
    freshness.observe(Heartbeat(stores(checkpoint_uri), drivers).read(), now)
    silent = freshness.age(now)
    if silent < heartbeat_timeout:
        return Evidence(None, silent, None)
    record = read_record()
    lease = None
    if record is not None and (running := record.current_attempt) is not None:
        lease = running.lease_of(record.job_id)
    if lease is None:
        return Evidence(record, silent, None)
    return Evidence(record, silent, provider.observe([lease]).get(lease.lease_id))


@dataclass
class Looks:
    """Per Running flow run another worker may drive: its heartbeat's freshness and when it
    is next worth a look (a run that beats is read once per timeout, not every check)."""

    monotonic: Callable[[], float] = time.monotonic
    runs: dict[Any, tuple[Freshness, float]] = field(default_factory=dict)
    claims: dict[Any, tuple[bytes, float]] = field(default_factory=dict)  # others' claims seen

    def due(self, run_id: Any) -> Freshness | None:
        """The run's freshness if a look is due now, else None."""
        now = self.monotonic()
        freshness, next_at = self.runs.setdefault(run_id, (Freshness(started_at=now), now))
        return freshness if now >= next_at else None

    def looked(self, run_id: Any, evidence: Evidence, heartbeat_timeout: float) -> None:
        """After a look: a silent run again at the next check, one that beats not before
        the timeout (nor a new one: silence is only seen over a whole timeout)."""
        silent = evidence.silent_for >= heartbeat_timeout
        self.runs[run_id] = (
            self.runs[run_id][0],
            self.monotonic() + (0.0 if silent else heartbeat_timeout),
        )

    def never(self, run_id: Any) -> None:
        self.runs[run_id] = (self.runs[run_id][0], float("inf"))

    def keep_only(self, run_ids) -> None:
        """Forget the runs no longer Running."""
        keep = set(run_ids)
        self.runs = {k: v for k, v in self.runs.items() if k in keep}
        self.claims = {k: v for k, v in self.claims.items() if k in keep}

    def claim(self, run_id: Any, store, attempt: int, owner: str, timeout: float) -> bool:
        """Claim the run's open ``attempt`` for ``owner`` in the job's ``store`` (blocking
        I/O: run in a thread); False when another worker holds a live claim on it."""
        key = CLAIM_KEY.format(attempt)
        current = store.get_object(key)
        seen = self.claims.get(run_id)
        if current is not None and (seen is None or seen[0] != current):
            seen = self.claims[run_id] = (current, self.monotonic())  # a claim new to us
        if not may_take(current, seen, self.monotonic(), timeout):
            return False
        mine = json.dumps({"owner": owner, "attempt": attempt}, allow_nan=False).encode()
        self.claims.pop(run_id, None)
        return store.swap_object(key, current, mine)


class AdoptingWorker(Protocol):
    """What adoption uses of the spot worker (``prefect_spot.workers.spot.SpotWorker``,
    which imports this module)."""

    _driving: set[Any]  # ids of the flow runs the worker drives now

    @property
    def name(self) -> str: ...

    @property
    def backend_id(self) -> Any: ...

    @property
    def client(self) -> Any: ...

    @property
    def work_pool(self) -> Any: ...

    @property
    def job_configuration(self) -> Any: ...

    @property
    def _work_pool_name(self) -> str: ...

    @property
    def _runs_task_group(self) -> Any: ...

    @property
    def _logger(self) -> Any: ...

    def _provider(self, configuration: Any) -> Any: ...

    def _checkpoint_uri(self, configuration: Any, flow_run: FlowRun) -> str: ...

    def get_flow_run_logger(self, flow_run: FlowRun) -> Any: ...

    async def run(self, flow_run: FlowRun, configuration: Any) -> Any: ...


class Adoption:
    """A spot worker's looks for orphans of its work pool, and its adoption of them: what
    it has seen of the runs others drive, and whose claim on an orphan is its own."""

    def __init__(self, worker_name: str) -> None:
        self.looks = Looks()  # Running runs other workers may drive
        self.owner = f"{worker_name}/{uuid.uuid4().hex[:12]}"  # whose claim on an orphan
        self._next_check_at = 0.0

    def due(self) -> bool:
        """Whether a look is due (every ``ORPHAN_CHECK_SECONDS``); the next is then set."""
        if time.monotonic() < self._next_check_at:
            return False
        self._next_check_at = time.monotonic() + ORPHAN_CHECK_SECONDS
        return True

    async def look(self, worker: AdoptingWorker) -> None:
        """Look at every Running run of ``worker``'s pool it does not drive, adopting the
        orphans (one unreadable run is logged and does not hide the others)."""
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType

        # The runs this worker drives are left out by the server: a worker watching 200
        # running flows would otherwise read and parse all 200 at every look.
        driving = worker._driving
        not_driven = FlowRunFilterId(not_any_=list(driving)) if driving else None
        running: list[FlowRun] = []
        while True:  # every Running run of the pool that others drive, a page at a time
            page = await worker.client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    id=not_driven,
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
                ),
                work_pool_filter=WorkPoolFilter(
                    name=WorkPoolFilterName(any_=[worker._work_pool_name])
                ),
                limit=ORPHAN_PAGE,
                offset=len(running),
            )
            running += page
            if len(page) < ORPHAN_PAGE:
                break
        self.looks.keep_only(run.id for run in running)
        for flow_run in running:
            freshness = None if flow_run.id in driving else self.looks.due(flow_run.id)
            if freshness is None:
                continue
            try:
                await self._look_at(worker, flow_run, freshness)
            except Exception:  # noqa: BLE001 - one unreadable run does not hide the others
                worker._logger.warning(
                    "could not check flow run %s for adoption", flow_run.id, exc_info=True
                )

    async def _look_at(
        self, worker: AdoptingWorker, flow_run: FlowRun, freshness: Freshness
    ) -> None:
        """Adopt ``flow_run`` if it is an orphan; remember when it is next worth a look."""
        configuration = await worker.job_configuration.resolve_for_flow_run(
            flow_run,
            client=worker.client,
            work_pool=copy.deepcopy(worker.work_pool),
            worker_name=worker.name,
            worker_id=worker.backend_id,
        )
        spot = configuration.spot_configuration()
        timeout = spot.heartbeat_timeout
        if not configuration.checkpoint_root or timeout is None:
            # its heartbeat was in its own worker's scratch dir, or it has none
            self.looks.never(flow_run.id)
            return
        provider = await anyio.to_thread.run_sync(worker._provider, configuration)
        uri, stores = worker._checkpoint_uri(configuration, flow_run), provider_stores(provider)
        evidence = await anyio.to_thread.run_sync(
            gather,
            freshness,
            uri,
            stores,
            timeout,
            self.looks.monotonic(),
            lambda: load_record(record_key(flow_run.id)),
            provider,
            spot.heartbeat_uri,
        )
        self.looks.looked(flow_run.id, evidence, timeout)
        reason = orphaned(evidence, timeout)
        running = None if evidence.record is None else evidence.record.current_attempt
        if reason is None or running is None or flow_run.id in worker._driving:
            return  # (an orphan always has its record's open attempt)
        attempt = running.number
        if not await anyio.to_thread.run_sync(
            self.looks.claim, flow_run.id, stores(uri), attempt, self.owner, timeout
        ):
            worker._logger.info(
                "flow run %s is an orphan another worker adopts (it claimed attempt %d first)",
                flow_run.id,
                attempt,
            )
            return
        worker.get_flow_run_logger(flow_run).warning("adopting the flow run: %s", reason)
        if worker._runs_task_group is None:  # made when the worker starts
            raise RuntimeError("Worker not properly initialized")
        worker._driving.add(flow_run.id)  # the next check must not adopt it again
        worker._runs_task_group.start_soon(_adopt, worker, flow_run, configuration)


async def _adopt(
    worker: AdoptingWorker, flow_run: FlowRun, configuration: SpotJobConfiguration
) -> None:
    """Drive the adopted run from its record, as a worker restarted with it would."""
    try:
        await worker.run(flow_run, configuration)
    except Exception:  # noqa: BLE001 - logged on the run; the next check may try again
        worker.get_flow_run_logger(flow_run).exception("driving the adopted flow run failed")
    finally:
        worker._driving.discard(flow_run.id)
