"""One job, assembled once: settings and an engine's context in, a ready ``Controller``
and ``JobSpec`` out.

Every driver of the controller (``spot-pipelines run``, ``SpotJobOperator``,
``SpotKubernetesPodOperator``, ``SpotJobTrigger``, ``@task.spot``, Prefect's
``SpotTaskRunner``, ``spot`` worker and ``spot_task``, the sweeps' trial runner) builds
its job here and keeps only its engine's concerns: where the record lives, how credentials
are resolved, how it waits. What an engine needs of a provider (its ``ProviderPlugin``:
capabilities, the kind of session it takes, which stores its leases reach, the
environment and Python a lease gets, its console link) also comes through here
(``provider_plugin``), so no engine imports ``spot_core.providers`` and none branches on
a provider's name. The path, the same in every engine::

    settings = SpotSettings.build(where="train", provider="ec2", ...)
    provider = jobs.open_provider_for(settings, session=access)  # the engine's credentials
    controller = jobs.assemble(settings, provider, persist=save, listener=on_event)
    spec = jobs.job_spec(settings, provider, job_id=jobs.job_id(dag, task, run),
                         command=["python", "train.py"], checkpoint_uri=uri,
                         created_at=None if stored is None else stored.created_at)
    record = stored or controller.persist(controller.new_record(spec))
    nxt = controller.advance(spec, record)

An engine that keeps the provider's options itself and opens it in several processes
(Airflow's ``SpotHook``: the operator's worker, then the triggerer with the first one's
resolved ``provider.options``) opens it by name instead,
``jobs.open_provider(name, session=own, **options)`` (``spot_core.providers.open_provider``),
and assembles its controller with ``jobs.assemble`` all the same; a trigger has the spec
already (``Relaunch``) or needs only the job's id and store (``watch_spec``).

``InPlaceAttempt`` is the same for the in-place decorators (``@task.spot``, ``spot_task``):
one call of a function on the worker that runs it, opened, checkpointed, watched for
notices and closed by the controller.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spot_core.attempt_env import clip
from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.controller import Controller, JobSpec, Listener, Persist
from spot_core.credentials import credential_findings
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, Lease, Pool
from spot_core.providers.base import (
    Capability,
    LeaseState,
    LeaseStatus,
    Observation,
    Provider,
    ProviderPlugin,
    SessionKind,
)
from spot_core.providers.in_place import InPlaceProvider
from spot_core.providers.registry import (
    check_provider,
    open_provider,
    provider_names,
    provider_plugin,
    refuse_credentials,
)
from spot_core.settings import SpotSettings

Stores = Callable[[str], CheckpointStore]
# What a driver reports of a lease and reads back from a shared observer.
__all__ = [
    "Capability",
    "InPlaceAttempt",
    "LeaseState",
    "LeaseStatus",
    "Observation",
    "Provider",
    "ProviderPlugin",
    "Relaunch",
    "SessionKind",
    "assemble",
    "check_provider",
    "detectors",
    "job_id",
    "job_spec",
    "open_provider",
    "open_provider_for",
    "provider_names",
    "provider_plugin",
    "publish_from_lease",
    "refuse_credentials",
    "relaunch",
    "select_pools",
    "trace_position",
    "watch_spec",
]

MAX_JOB_ID = 200


def detectors() -> list[dict[str, Any]]:
    """Every installed interruption notice detector (``spot_pipelines.detectors``): name,
    summary, aliases, whether ``auto`` probes it."""
    from spot_core.interruption import registry

    return [
        {
            "name": name,
            "summary": found.summary,
            "aliases": list(found.aliases),
            "probed": found.probe is not None,
        }
        for name in registry.detector_names()
        for found in (registry.detector_plugin(name),)
    ]


def job_id(*parts: str | int | None) -> str:
    """A job id from an engine's parts (a DAG, task, map index and run; a flow run): one
    string safe in store paths, lease tags and pod names, at most 200 characters."""
    text = ".".join(str(p) for p in parts if p not in (None, ""))
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:MAX_JOB_ID]


# -- the provider -------------------------------------------------------------------------------
def open_provider_for(
    settings: SpotSettings, *, session: Any = None, scratch_dir: str | None = None
) -> Provider:
    """The provider the settings name, for a new job: its options checked and completed
    by its plugin (the session's region, the settings' instance types, the engine's
    ``scratch_dir`` for a cloud in this process). ``session``: the engine's credentials of
    the kind the plugin takes (``provider_plugin(name).session``), resolved in this
    process; None: the SDK's chain. Its ``options`` then reopen it in another process
    (``open_provider``)."""
    found = provider_plugin(settings.provider)
    check_provider(settings.provider, settings.provider_options, settings.instance_types)
    session = session if found.session is not None else None
    options = found.option_defaults(
        settings.provider_options,
        instance_types=settings.instance_types,
        session=session,
        scratch_dir=scratch_dir,
    )
    return found.open(options, session)


def select_pools(
    provider: Provider,
    *,
    zones: Sequence[str] = (),
    instance_types: Sequence[str] = (),
    names: Sequence[str] | None = None,
    aliases: Mapping[str, Pool] | None = None,
    keep: Callable[[Pool], bool] | None = None,
) -> tuple[Pool, ...]:
    """The job's pools: the provider's, narrowed to ``zones`` and ``instance_types`` and
    by an engine's own ``keep`` (a Kubernetes operator's node pools), or chosen by
    ``names`` (zones, pool keys, or the provider's ``aliases`` such as trace names). A
    zone, type or name the provider does not offer, or nothing left, is one ConfigError
    line naming what it offers."""
    offered = tuple(provider.pools())
    if names is not None:
        known = {name: p for p in offered for name in (p.zone, p.key)}
        known.update({k: v for k, v in (aliases or {}).items() if k not in known})
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(
                f"unknown pool(s) {', '.join(unknown)}; choose from "
                f"{', '.join(sorted(p.zone for p in offered))}"
            )
        return tuple(dict.fromkeys(known[n] for n in names))
    for what, wanted, have in (
        ("zone", zones, {p.zone for p in offered}),
        ("instance type", instance_types, {p.instance_type for p in offered}),
    ):
        missing = sorted(set(wanted or ()) - have)
        if missing:
            raise ConfigError(
                f"provider {provider.name!r} has no {what}(s) {missing}; choose "
                f"from {', '.join(sorted(have)) or 'none'}, or name none"
            )
    chosen = tuple(
        p
        for p in offered
        if (not zones or p.zone in zones)
        and (not instance_types or p.instance_type in instance_types)
        and (keep is None or keep(p))
    )
    if not chosen:
        shown = sorted({f"{p.zone}/{p.instance_type}" for p in offered})
        raise ConfigError(
            f"no pool of provider {provider.name!r} is left for this job "
            f"(zones={list(zones) or None}, instance_types="
            f"{list(instance_types) or None}); it offers {', '.join(shown)}"
        )
    return chosen


def trace_position(provider: Provider, now: float | None = None) -> str:
    """Where a provider replaying traces is in them (for a log line), else nothing."""
    if Capability.TRACE_CLOCK not in provider.capabilities:
        return ""
    return f" at trace tick {provider.market.tick_at(time.time() if now is None else now)}"


def publish_from_lease(key: str, value: str, environ: Mapping[str, str]) -> str:
    """On a lease: set ``key`` to ``value`` on the lease's own capacity (an EC2 tag, a
    pod's annotation), through whichever installed provider launched it; its name."""
    for name in provider_names():
        found = provider_plugin(name)
        if Capability.LEASE_TAGS in found.capabilities and found.publish_from_lease(
            key, value, environ
        ):
            return name
    raise ConfigError(
        f"no installed provider publishes {key} from this machine: it is not "
        "a lease of a provider with lease tags (an EC2 instance of the ec2 "
        "provider, a pod of the kubernetes provider)"
    )


# -- the job -------------------------------------------------------------------------------------
def assemble(
    settings: SpotSettings,
    provider: Provider,
    *,
    max_user_retries: int | None = None,
    persist: Persist | None = None,
    listener: Listener | None = None,
    stores: Stores | None = None,
    engine_stores: Stores | None = None,
) -> Controller:
    """The job's controller under ``settings``, the one every driver drives: its retry
    policy (an engine passes its own user-failure budget as ``max_user_retries``) and its
    lifecycle's bounds, over ``provider`` (opened by ``open_provider_for`` for a new job,
    by ``open_provider`` from another process's options). ``persist`` keeps the record
    where the engine keeps it, ``listener`` hears each transition. The job's stores are
    opened with ``stores`` when given (a store with credentials of its own, a Prefect
    CheckpointStorage block), else with the provider's credentials when it declares
    ``OWN_STORES``, else with ``engine_stores`` (an Airflow connection's), else with
    boto3's default chain."""
    if stores is None and Capability.OWN_STORES not in provider.capabilities:
        stores = engine_stores
    return Controller(
        provider,
        provider.market,
        settings.retry_policy(max_user_retries=max_user_retries),
        persist=persist,
        listener=listener,
        stores=stores,
        **settings.controller_options(),
    )


def job_spec(
    settings: SpotSettings,
    provider: Provider,
    *,
    job_id: str,
    checkpoint_uri: str | Callable[[], str],
    command: Sequence[str] = (),
    pools: Sequence[Pool] | None = None,
    env: Mapping[str, str] | None = None,
    image: str | None = None,
    created_at: float | None = None,
) -> JobSpec:
    """The job under ``settings``: ``pools`` (default: the settings' zones and instance
    types, ``select_pools``), its deadline fields under the settings' time convention
    (durations in the provider's capacity time, counted from ``created_at``, its
    JobRecord's; None: a new job, now). ``checkpoint_uri`` may be a callable, called last,
    after every check (the CLI creates the folder there, so a bad flag leaves none)."""
    if pools is None:
        pools = select_pools(provider, zones=settings.zones, instance_types=settings.instance_types)
    deadline = settings.deadline_spec(
        created_at=time.time() if created_at is None else created_at,
        capacity_per_wall=provider.capacity_seconds(1.0),
    )
    uri = checkpoint_uri() if callable(checkpoint_uri) else checkpoint_uri
    return JobSpec(
        job_id=job_id,
        command=tuple(command),
        checkpoint_uri=uri,
        pools=tuple(pools),
        env=dict(env or {}),
        image=image,
        **deadline,
    )


def watch_spec(job_id: str, checkpoint_uri: str) -> JobSpec:
    """What ``check`` and ``stop`` read of a job: its id and its store (a trigger has no
    more of it, and needs no more)."""
    return JobSpec(job_id=job_id, command=(), checkpoint_uri=checkpoint_uri, pools=())


@dataclass(frozen=True)
class Relaunch:
    """What a driver that did not build the job needs to launch its next attempt as the
    one that built it would: the job's spec (command, pools, environment, deadline), the
    retry policy's knobs (budgets, fallback, price cap) and the engine's user-failure
    budget. A deferrable operator's trigger carries it (``to_dict``) so that, on an
    interruption notice, its controller launches the replacement in the triggerer
    (``handover``) instead of waking a worker. No credentials: the spec's environment is
    checked by the provider as the operator's is, and the connections stay ids."""

    spec: JobSpec
    policy_options: Mapping[str, Any]
    max_user_retries: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (a trigger's kwargs)."""
        return {
            "spec": self.spec.to_dict(),
            "policy_options": dict(self.policy_options),
            "max_user_retries": self.max_user_retries,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Relaunch:
        """``to_dict()``'s output back, its policy knobs checked by the settings model;
        anything else is one ConfigError."""
        if not isinstance(data, Mapping) or not isinstance(data.get("policy_options"), Mapping):
            raise ConfigError(
                "launch is not a mapping with spec and policy_options; "
                "it was not written by spot-pipelines"
            )
        options = dict(data["policy_options"])
        allowed = SpotSettings().policy_knob_values()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ConfigError(
                f"launch: unknown policy_options {unknown}; choose from {list(allowed)}"
            )
        retries = data.get("max_user_retries")
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)):
            raise ConfigError(f"launch: max_user_retries={retries!r} must be an integer or None")
        SpotSettings.build(check_options=False, **options)  # the model's checks
        spec = JobSpec.from_dict(data.get("spec") or {})
        found = credential_findings(spec.env)
        if found:
            raise ConfigError(
                f"launch: env {', '.join(sorted(found))} looks like credentials, which "
                "never ride in a trigger's kwargs; the operator leaves launch out for such "
                "a job (its worker hands over on the notice)"
            )
        return cls(spec, options, retries)

    def settings(self, controller_options: Mapping[str, Any]) -> SpotSettings:
        """The settings the launching driver's controller ran with (its controller knobs
        and these policy knobs)."""
        return SpotSettings.build(check_options=False, **controller_options, **self.policy_options)


def relaunch(
    settings: SpotSettings, spec: JobSpec, *, max_user_retries: int | None = None
) -> Relaunch | None:
    """The job's ``Relaunch`` under ``settings``; None when its step's environment holds
    what looks like a credential (by name or value): that never rides in a trigger's
    kwargs, so such a job's trigger only watches and its worker hands over."""
    if credential_findings(spec.env):
        return None
    return Relaunch(spec, settings.policy_knob_values(), max_user_retries)


# -- in place --------------------------------------------------------------------------------
class InPlaceAttempt:
    """One call of an in-place step (``@task.spot``, ``spot_task``) as an attempt of its
    job, written once for both engines.

    The engine put the step on a (spot) worker; that worker is the attempt's lease
    (``InPlaceProvider``). ``open`` closes one a vanished earlier call left open, fences
    the store and records the attempt (``Controller.adopt``); ``checkpointer`` and
    ``watch_notices`` give the call a Checkpointer on the job's store and turn a notice
    into an emergency save; ``succeeded``, ``preempted``, ``failed`` and ``stopped``
    report how the call ended, and the controller classifies, bills and records it. The
    record itself is the engine's (``persist``: the task state store, a Prefect
    artifact)."""

    def __init__(
        self,
        settings: SpotSettings,
        *,
        job_id: str,
        checkpoint_uri: str,
        stores: Stores = open_store,
        persist: Persist | None = None,
        listener: Listener | None = None,
        cloud: str = "auto",
    ) -> None:
        self.settings = settings
        self.stores = stores
        self.provider = InPlaceProvider(cloud=cloud)
        self.spec = JobSpec(
            job_id=job_id, command=(), checkpoint_uri=checkpoint_uri, pools=self.provider.pools()
        )
        # The engine owns the worker: no heartbeat, nothing to launch or terminate.
        self.controller = Controller(
            self.provider,
            None,
            settings.retry_policy(),
            persist=persist,
            listener=listener,
            stores=stores,
            heartbeat_timeout_seconds=None,
        )
        self.record: JobRecord | None = None
        self.lease: Lease | None = None

    def open(self, stored: JobRecord | None, *, attempt: int | None = None) -> JobRecord:
        """Open this call's attempt on ``stored`` (None: a new record, persisted first).
        ``attempt``: the number the capacity already runs as (a spot worker's lease)."""
        record = stored or self.controller.persist(self.controller.new_record(self.spec))
        self.record, self.lease = self.controller.adopt(
            self.spec,
            record,
            lambda number, now: self.provider.adopt(self.spec.job_id, number, now),
            attempt=attempt,
        )
        return self.record

    def checkpointer(self, *, notice_file: str | None = None) -> Any:
        """A Checkpointer on the job's store for this attempt (``open`` fenced the store
        for it), on the settings' schedule; ``notice_file``: the watcher's, whose
        appearance is a notice too. The caller restores and closes it."""
        from spot_core.checkpoint import Checkpointer

        return Checkpointer(
            self.stores(self.spec.checkpoint_uri),
            attempt=self._number,
            notice_file=notice_file,
            **self.settings.checkpointer_options(),
        )

    def watch_notices(self, checkpointer: Any, *, cloud: str, endpoint: str | None) -> Any:
        """A started watcher of ``cloud``'s notices (``auto`` probes) that turns an
        interruption (not a rebalance recommendation) into an emergency save at the
        step's next ``maybe_save``; the caller closes it."""
        from spot_core.interruption import InterruptionWatcher, detector_for

        watcher = InterruptionWatcher(
            [detector_for(cloud, endpoint)],
            poll_interval=self.settings.notice_poll_interval_seconds,
        )

        def on_notice(notice: Any) -> None:
            if notice.is_interruption:
                checkpointer.request_emergency_save(
                    f"{notice.cloud} {notice.kind} notice ({notice.action})"
                )

        watcher.add_handler(on_notice)
        return watcher.start()

    def succeeded(self) -> JobRecord:
        """The call returned: the attempt (and so the job) succeeded."""
        return self._end(LeaseState.EXITED, 0, None)

    def preempted(self, exc: BaseException) -> JobRecord:
        """The call stopped on a notice after its emergency save: a preemption."""
        from spot_core.attempt_env import PREEMPTED_EXIT_CODE

        return self._end(LeaseState.EXITED, PREEMPTED_EXIT_CODE, exc, notice=True)

    def failed(self, exc: BaseException) -> JobRecord:
        """The step's own code raised: a failure that spends the engine's retries."""
        return self._end(LeaseState.EXITED, 1, exc)

    def stopped(self, exc: BaseException) -> JobRecord:
        """The call was cancelled or interrupted from outside: not the step's fault."""
        return self._end(LeaseState.TERMINATED, None, exc)

    @property
    def _number(self) -> int:
        if self.lease is None:
            raise ValueError("InPlaceAttempt.open() first")
        return self.lease.attempt

    def _end(
        self,
        state: LeaseState,
        exit_code: int | None,
        exc: BaseException | None,
        *,
        notice: bool = False,
    ) -> JobRecord:
        if self.record is None:
            raise ValueError("InPlaceAttempt.open() first")
        now = time.time()
        message = "" if exc is None else clip(f"{type(exc).__name__}: {exc}", 300)
        self.record = self.controller.on_lease_end(
            self.spec,
            self.record,
            LeaseStatus(
                state,
                exit_code=exit_code,
                notice_at=now if notice else None,
                ended_at=now,
                message=message,
            ),
            now,
        )
        return self.record
