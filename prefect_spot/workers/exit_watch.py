"""A flow run's lease exit, read together with the flow run's state.

Prefect's engine exits 0 once it has reported a failed flow run, so an exit code of 0
alone does not say the step succeeded. The worker hands its controller the provider
wrapped in :class:`FlowRunExit`, which implements the provider protocol by delegating
every method and corrects the exit code of what it observes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core.checkpoint import CheckpointStore
from spot_core.jobs import Capability, LeaseStatus, Observation, Provider
from spot_core.model import Lease, Outcome, Pool


class FlowRunExit:
    """The provider, with each lease's exit code read together with its flow run's state.

    The process's exit status is 0 only if the flow run Completed. The controller then
    classifies the end as usual (a failure after an interruption notice is a preemption).
    Every other call goes to the provider as it is; the optional ones (``open_store``,
    ``launch_any``, ``instance_tag``, ``cleanup_orphans``) only where its ``capabilities``
    declare them, as for any provider."""

    def __init__(self, provider: Provider, flow_run_id: Any) -> None:
        self._provider = provider
        self._flow_run_id = flow_run_id
        self.name: str = provider.name
        self.capabilities: Capability = provider.capabilities
        self.market: Any = provider.market

    # -- the provider protocol (spot_core.jobs.Provider), delegated -------------------------
    @property
    def options(self) -> Mapping[str, Any]:
        return self._provider.options

    def pools(self) -> tuple[Pool, ...]:
        return self._provider.pools()

    def launch(self, spec: Any, pool: Pool) -> Lease:  # a LaunchSpec
        return self._provider.launch(spec, pool)

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        statuses = self._provider.observe(leases)
        return {lease_id: self._corrected(status) for lease_id, status in statuses.items()}

    def bill(self, lease: Lease, ended_at: float) -> Any:  # a Bill
        return self._provider.bill(lease, ended_at)

    def capacity_seconds(self, wall_seconds: float) -> float:
        return self._provider.capacity_seconds(wall_seconds)

    def terminate(self, lease: Lease) -> None:
        self._provider.terminate(lease)

    def close(self) -> None:
        self._provider.close()

    # -- the optional methods a provider's capabilities declare ----------------------------
    def open_store(self, uri: str) -> CheckpointStore:
        """``Capability.OWN_STORES``."""
        opened: CheckpointStore = self._optional("open_store")(uri)
        return opened

    def launch_any(self, spec: Any, pools: Sequence[Pool]) -> Lease:
        """``Capability.LAUNCH_ANY``."""
        lease: Lease = self._optional("launch_any")(spec, pools)
        return lease

    def instance_tag(self, region: str, lease_id: str, key: str) -> str | None:
        """``Capability.LEASE_TAGS``."""
        value: str | None = self._optional("instance_tag")(region, lease_id, key)
        return value

    def cleanup_orphans(self, job_id: str | None = None) -> list[str]:
        """``Capability.CLEANUP_ORPHANS``."""
        ended: list[str] = self._optional("cleanup_orphans")(job_id)
        return ended

    def _optional(self, name: str) -> Any:
        """The provider's own optional method (AttributeError, as on the provider itself,
        when it has none)."""
        return getattr(self._provider, name)

    # -- the exit code, corrected ----------------------------------------------------------
    def corrected(self, observed: Observation) -> Observation:
        """A shared observer's ``observed``, its exit code read as ``observe`` reads it
        (blocking when the lease exited 0: call it from a thread)."""
        if observed.status is None or observed.error is not None:
            return observed
        return dataclasses.replace(observed, status=self._corrected(observed.status))

    def _corrected(self, status: LeaseStatus) -> LeaseStatus:
        if (
            not status.ended
            or status.exit_code != 0
            or status.outcome not in (None, Outcome.SUCCEEDED)
        ):
            return status  # a provider's verdict other than success stands
        from prefect import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(self._flow_run_id).state
        if state is not None and state.is_completed():
            return status
        message = (
            state.message
            if state is not None and state.message
            else "the flow run did not complete"
        )
        return dataclasses.replace(status, exit_code=1, outcome=None, message=message[:300])


def check(controller: Any, spec: Any, nxt: Any, observed: Observation) -> Any:
    """``check`` with the shared observer's observation, its exit code corrected by the
    controller's :class:`FlowRunExit` (both may block: run in a thread)."""
    return controller.check(spec, nxt, observed=controller.provider.corrected(observed))
