"""The types a driver exchanges with the controller: the job (``JobSpec``), what to do
next (``Next``), the persistence and listener callbacks, and how a job's store is opened.

Every driver imports these (through ``spot_core.controller``, which re-exports them); they
are JSON-able so a driver can carry them across processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord, JobStatus, Lease, Market, Pool
from spot_core.policy.deadline.planner import check_deadline_policy
from spot_core.providers.base import Capability, Provider
from spot_core.settings import SpotSettings

Persist = Callable[[JobRecord], None]
Listener = Callable[[str, JobRecord, str], None]


@dataclass(frozen=True)
class JobSpec:
    """One job: what to run, where it may run, where it checkpoints, and by when."""

    job_id: str
    command: tuple[str, ...]
    checkpoint_uri: str
    pools: tuple[Pool, ...]
    # The job's deadline, a wall-clock POSIX time (``SpotSettings.deadline_spec``).
    deadline_at: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # What a deadline-bound job needs, in capacity seconds, so the policy can tell when
    # spot no longer fits before the deadline; progress comes from checkpoint steps.
    work_capacity_seconds: float | None = None
    total_steps: int | None = None
    restart_overhead_capacity_seconds: float = SpotSettings.restart_overhead_capacity_seconds
    # Run ``command`` in this container image (see ``spot_core.container``).
    image: str | None = None
    # A deadline policy by name (``spot_core.policy.deadline.policies``: greedy,
    # uniform-progress, default, ...) that decides spot / on-demand / wait between attempts
    # on a trace market (see ``spot_core.policy.deadline.planner``); None: only the safety
    # net (go on-demand once the work and two restarts no longer fit), as on EC2.
    deadline_policy: str | None = None

    def __post_init__(self) -> None:
        if self.deadline_policy is None:
            return
        check_deadline_policy(self.deadline_policy)
        if self.deadline_at is None or self.work_capacity_seconds is None:
            raise ConfigError(
                f"deadline policy {self.deadline_policy!r} needs the job's "
                "deadline and work (--deadline and --work)"
            )

    def candidate_pools(self) -> tuple[Pool, ...]:
        """The spot pools and their on-demand counterparts, without duplicates."""
        on_demand = tuple(p.on(Market.ON_DEMAND) for p in self.pools if p.is_spot)
        return tuple(dict.fromkeys(self.pools + on_demand))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, so a driver that did not build the job can launch its next attempt
        (a trigger handing over on the notice carries it in its kwargs)."""
        return {
            "job_id": self.job_id,
            "command": list(self.command),
            "checkpoint_uri": self.checkpoint_uri,
            "pools": [pool.to_dict() for pool in self.pools],
            "deadline_at": self.deadline_at,
            "env": dict(self.env),
            "work_capacity_seconds": self.work_capacity_seconds,
            "total_steps": self.total_steps,
            "restart_overhead_capacity_seconds": self.restart_overhead_capacity_seconds,
            "image": self.image,
            "deadline_policy": self.deadline_policy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """``to_dict()``'s output back; anything else is one ConfigError (a trigger's kwargs
        can be truncated or forged)."""
        try:
            command = data["command"]
            env = data.get("env") or {}
            if not isinstance(command, (list, tuple)) or not all(
                isinstance(part, str) for part in command
            ):
                raise ValueError(f"command={command!r} is not a list of strings")
            if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ValueError("env is not a mapping of strings to strings")
            numbers = {
                name: data.get(name)
                for name in (
                    "deadline_at",
                    "work_capacity_seconds",
                    "total_steps",
                    "restart_overhead_capacity_seconds",
                )
            }
            for name, value in numbers.items():
                if value is not None and (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                ):
                    raise ValueError(f"{name}={value!r} is not a finite number")
            overhead = numbers["restart_overhead_capacity_seconds"]
            return cls(
                job_id=str(data["job_id"]),
                command=tuple(command),
                checkpoint_uri=str(data["checkpoint_uri"]),
                pools=tuple(Pool.from_dict(pool) for pool in data["pools"]),
                deadline_at=numbers["deadline_at"],
                env=dict(env),
                work_capacity_seconds=numbers["work_capacity_seconds"],
                total_steps=None if numbers["total_steps"] is None else int(numbers["total_steps"]),
                restart_overhead_capacity_seconds=(
                    SpotSettings.restart_overhead_capacity_seconds
                    if overhead is None
                    else float(overhead)
                ),
                image=data.get("image"),
                deadline_policy=data.get("deadline_policy"),
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"the job's spec is malformed ({type(exc).__name__}: "
                f"{exc}); it was not written by spot-pipelines"
            ) from None


FINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEADLINE_MISSED)
NextAction = Literal["finished", "sleep", "watch", "ended"]
NEXT_ACTIONS = ("finished", "sleep", "watch", "ended")


@dataclass(frozen=True)
class Next:
    """What a driver does now, with the record it must keep.

    ``finished``: the job settled (``record.status`` says how). ``sleep``: call
    ``advance`` again at ``until``. ``watch``: the attempt runs on ``lease``; call
    ``check`` every ``poll_interval_seconds`` (its bound is ``until``, the attempt's time limit).
    ``ended``: the watched attempt just closed (``record.attempts[-1]`` says how); call
    ``advance`` for what comes next.
    """

    action: NextAction
    record: JobRecord
    until: float = 0.0
    lease: Lease | None = None
    reason: str = ""
    failing_since: float | None = None  # watch: start of a run of failed observations
    notice_at: float | None = None  # watch: first interruption notice seen

    @property
    def last_attempt(self) -> Attempt | None:
        return self.record.attempts[-1] if self.record.attempts else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, so a driver can carry it across processes (a trigger's kwargs)."""
        return {
            "action": self.action,
            "record": self.record.to_dict(),
            "until": self.until,
            "lease": None if self.lease is None else self.lease.to_dict(),
            "reason": self.reason,
            "failing_since": self.failing_since,
            "notice_at": self.notice_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Next:
        """``to_dict()``'s output back; anything else is one ConfigError (a trigger's kwargs
        or event read back can be truncated or forged)."""
        try:
            if data.get("action") not in NEXT_ACTIONS:
                raise ValueError(
                    f"action={data.get('action')!r} is not one of {', '.join(NEXT_ACTIONS)}"
                )
            times = {name: data.get(name) for name in ("until", "failing_since", "notice_at")}
            for name, value in times.items():
                if value is not None and (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                ):
                    raise ValueError(f"{name}={value!r} is not a finite time")
            lease = data.get("lease")
            record = JobRecord.from_dict(data["record"])
            return cls(
                action=data["action"],
                record=record,
                until=float(times["until"] or 0.0),
                lease=None if lease is None else Lease.from_dict(lease),
                reason=str(data.get("reason") or ""),
                failing_since=times["failing_since"],
                notice_at=times["notice_at"],
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"the controller's Next is malformed ({type(exc).__name__}: "
                f"{exc}); it was not written by spot-pipelines"
            ) from None


@runtime_checkable
class _OpensStores(Protocol):
    """The optional method of a provider that declares ``Capability.OWN_STORES``."""

    def open_store(self, uri: str) -> CheckpointStore: ...


def provider_stores(provider: Provider) -> Callable[[str], CheckpointStore]:
    """How a job's store is opened: the provider's own opener (its credentials and
    clients) when it declares ``OWN_STORES``, else ``open_store``."""
    if Capability.OWN_STORES not in provider.capabilities:
        return open_store
    if not isinstance(provider, _OpensStores):
        raise AttributeError(
            f"the {provider.name} provider declares OWN_STORES but has no open_store method"
        )
    return provider.open_store
