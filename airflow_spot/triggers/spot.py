"""The trigger that drives one watched attempt from the triggerer, without a worker slot.

It is a thin driver of the controller: its kwargs carry the controller's ``Next`` (the
JobRecord and the watched lease included) and what reopens the provider and controller,
so a triggerer that restarts (or another one that picks the trigger up) resumes from
the kwargs alone. Every poll interval it takes its lease's status from the triggerer's
shared observer (``spot_core.observer``: one describe per provider and poll for every
deferred job, not one per trigger) and hands it to ``Controller.check`` in a thread (the
checks of one poll share a thread hop: ``spot_core.batched``): the controller renews the
driver heartbeat in the job's store, absorbs failed observations until
``observe_failure_timeout``, and classifies, bills and closes the attempt when it ends.
Handover. With ``launch`` (the job's spec and retry policy, ``spot_core.jobs.Relaunch``:
what the operator built, no credentials) the controller here hands over as a worker's
would: on the interruption notice it launches the replacement (``handover``), records it
in the Next, keeps watching the old lease and, once that one closes, adopts the
replacement (it fences the store) and watches it on. The task stays deferred throughout;
no worker wakes for the notice. Without ``launch`` (a trigger written by an older
operator) a replacement already launched is still adopted here.
The trigger fires once: on ``ended`` (the closed record is in the event), on the first
interruption notice nobody answered with a replacement (``return_on_notice``: the
policy waited, no capacity, no ``launch``), or, with a ``sleep`` Next, when the sleep is
over.

Kill safety. A user who marks the deferred task failed or success, or clears it, makes
Airflow 3.3 cancel the trigger with ``on_kill()``: the lease is stopped through
``Controller.stop``. ``cleanup()`` also runs on every triggerer restart, so it stops the
lease only when the task instance is no longer ``deferred`` (read through the Task SDK,
as cncf-kubernetes' pod trigger does), never on a mere restart. If the triggerer dies
outright, the node's heartbeat watch ends the lease once nobody renews the heartbeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_spot.hooks.connections import check_conn_id
from airflow_spot.hooks.spot import SpotHook
from spot_core import batched, jobs
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.controller import Controller, JobSpec, Next, Transition, adopts
from spot_core.errors import ConfigError
from spot_core.observer import SharedObserver, shared_observer, wait_timeout
from spot_core.settings import KNOBS, Knob, SpotSettings

EVENT_STATUSES = ("ended", "notice", "wake", "error")
# The controller's knobs a trigger carries (their surface names): the settings model's.
CONTROLLER_OPTIONS = tuple(k.name for k in KNOBS if k.controller)
_NOT_BEFORE = Knob("not_before", "number", "POSIX time", frozenset(), minimum=0, default=0.0)
KILLED = "stopped: the task was marked failed, cleared or killed while deferred"


class SpotJobTrigger(BaseTrigger):
    """Drive ``next`` (a ``watch`` or ``sleep`` Next as a dict) until it changes.

    :param provider: capacity provider name (``local``, ``ec2``, ``kubernetes``).
    :param provider_options: JSON-able options that reopen the provider in the triggerer.
    :param next: ``Next.to_dict()`` of the controller's last answer.
    :param checkpoint_uri: the job's store (the controller renews its heartbeat there).
    :param controller_options: the Controller's keyword options (poll_interval,
        attempt_timeout, heartbeat_timeout, observe_failure_timeout), as the worker used.
    :param return_on_notice: fire as soon as an interruption notice is seen.
    :param not_before: POSIX time before which no event fires. Airflow 3.3 can resume a
        task whose trigger fires before the executor has reported the deferring process's
        exit, then retry it as a zombie; holding the event a few seconds avoids that race.
    :param launch: ``spot_core.jobs.Relaunch.to_dict()`` of the job (its spec and retry
        policy knobs): lets this trigger launch the replacement on a notice itself.
    :param aws_conn_id / kubernetes_conn_id: the connections the operator used, by id
        only: the triggerer resolves them itself (its secrets backend or
        ``AIRFLOW_CONN_<ID>``), so no credential is ever in these kwargs.
    """

    def __init__(
        self,
        *,
        provider: str,
        provider_options: Mapping[str, Any],
        next: Mapping[str, Any],
        checkpoint_uri: str,  # noqa: A002 - the Next
        controller_options: Mapping[str, Any] | None = None,
        return_on_notice: bool = True,
        not_before: float = 0.0,
        launch: Mapping[str, Any] | None = None,
        aws_conn_id: str | None = None,
        kubernetes_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self._check(
            provider,
            provider_options,
            next,
            checkpoint_uri,
            controller_options,
            return_on_notice,
            not_before,
            launch,
        )
        check_conn_id(aws_conn_id, "aws_conn_id", "SpotJobTrigger")
        check_conn_id(kubernetes_conn_id, "kubernetes_conn_id", "SpotJobTrigger")
        self.aws_conn_id = aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        self.provider = provider
        self.provider_options = dict(provider_options)
        self.next = dict(next)
        self.checkpoint_uri = checkpoint_uri
        self.controller_options = dict(controller_options or {})
        self.launch = None if launch is None else dict(launch)
        self.relaunch = None if launch is None else jobs.Relaunch.from_dict(launch)
        # The controller's bounds (and, with ``launch``, its retry policy): the settings
        # model's, under the knobs the worker used.
        self.settings = (
            SpotSettings.build(check_options=False, **self.controller_options)
            if self.relaunch is None
            else self.relaunch.settings(self.controller_options)
        )
        self.return_on_notice = return_on_notice
        self.not_before = float(not_before)
        self._current: Next | None = None  # the latest Next, for on_kill / cleanup
        self._done = False  # an event fired or the lease was stopped

    @staticmethod
    def _check(
        provider,
        provider_options,
        nxt,
        checkpoint_uri,
        controller_options,
        return_on_notice,
        not_before,
        launch,
    ) -> None:
        """Kwargs as the operator writes them; anything else (a forged or truncated row in
        the trigger table) is one ValueError line here, before anything is watched."""
        try:
            if not isinstance(provider_options, Mapping):
                raise ConfigError(f"provider_options={provider_options!r} is not a mapping")
            jobs.check_provider(provider, provider_options)
            parse_store_uri(checkpoint_uri)
            options = dict(controller_options or {})
            unknown = sorted(set(options) - set(CONTROLLER_OPTIONS))
            if unknown:
                raise ConfigError(
                    f"unknown controller_options {unknown}; choose from "
                    f"{', '.join(CONTROLLER_OPTIONS)}"
                )
            # the settings model's checks (finite, > 0, ...)
            SpotSettings.build(check_options=False, **options)
            if not isinstance(return_on_notice, bool):
                raise ConfigError(f"return_on_notice={return_on_notice!r} must be True or False")
            _NOT_BEFORE.parse(not_before)
            parsed = Next.from_dict(nxt)
            if parsed.action not in ("watch", "sleep"):
                raise ConfigError(
                    f"next.action={parsed.action!r}: a trigger watches or sleeps only"
                )
            if launch is not None:
                spec = jobs.Relaunch.from_dict(launch).spec
                if (spec.job_id, spec.checkpoint_uri) != (parsed.record.job_id, checkpoint_uri):
                    raise ConfigError(
                        f"launch is job {spec.job_id!r} on {spec.checkpoint_uri}, not the "
                        f"watched job {parsed.record.job_id!r} on {checkpoint_uri}"
                    )
                jobs.check_provider(provider, provider_options, env=spec.env)
        except ConfigError as exc:
            raise ValueError(f"SpotJobTrigger: {exc}") from None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{self.__class__.__module__}.{self.__class__.__qualname__}",
            {
                "provider": self.provider,
                "provider_options": self.provider_options,
                "next": self.next,
                "checkpoint_uri": self.checkpoint_uri,
                "controller_options": self.controller_options,
                "return_on_notice": self.return_on_notice,
                "not_before": self.not_before,
                "launch": self.launch,
                "aws_conn_id": self.aws_conn_id,
                "kubernetes_conn_id": self.kubernetes_conn_id,
            },
        )

    # -- what the controller needs -----------------------------------------------------------
    def _spec(self, nxt: Next) -> JobSpec:
        """The job as the operator built it (``launch``: the controller can hand over),
        else what ``check`` and ``stop`` read of it: its id and its store."""
        if self.relaunch is not None:
            return self.relaunch.spec
        return jobs.watch_spec(nxt.record.job_id, self.checkpoint_uri)

    def hook(self) -> SpotHook:
        """The hook that opens (once per process) the provider these kwargs name."""
        return SpotHook(
            self.provider,
            self.provider_options,
            aws_conn_id=self.aws_conn_id,
            kubernetes_conn_id=self.kubernetes_conn_id,
        )

    def _controller(self) -> Controller:
        """Blocking (it resolves the connections and may open the provider): call it
        from a thread, never on the triggerer's event loop."""
        return self.hook().controller(self.settings, max_user_retries=self._user_retries)

    @property
    def _user_retries(self) -> int | None:
        """The engine's user-failure budget the operator's controller ran with."""
        return None if self.relaunch is None else self.relaunch.max_user_retries

    def _open(self) -> tuple[Controller, SharedObserver]:
        """The controller and the triggerer's one observer for its provider (keyed as the
        hook's provider cache: name, options, connection ids), shared by every trigger
        watching on it. Blocking, like ``_controller``."""
        hook = self.hook()
        controller = hook.controller(self.settings, max_user_retries=self._user_retries)
        return controller, shared_observer(hook.cache_key, controller.provider)

    @property
    def poll_interval(self) -> float:
        """Seconds between checks: the ``poll_interval`` knob (its default unless given)."""
        return self.settings.poll_interval_seconds

    # -- running -----------------------------------------------------------------------------
    async def run(self) -> AsyncIterator[TriggerEvent]:
        nxt = Next.from_dict(self.next)
        self._current = nxt
        if nxt.action == "sleep":
            await asyncio.sleep(max(0.0, max(nxt.until, self.not_before) - time.time()))
            self._done = True
            yield TriggerEvent({"status": "wake", "next": nxt.to_dict()})
            return
        try:  # opening the provider can read a connection: not on the event loop
            status = await self._watch(*await asyncio.to_thread(self._open), nxt)
            message = ""
        except Exception as exc:  # noqa: BLE001 - the operator persists the record and fails the try
            self.log.exception("driving job %s failed", nxt.record.job_id)
            status, message = "error", f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(max(0.0, self.not_before - time.time()))
        self._done = True
        yield TriggerEvent({"status": status, "next": self._current.to_dict(), "message": message})

    async def _watch(self, controller: Controller, observer: SharedObserver, nxt: Next) -> str:
        """Each poll: the lease's status from the shared observer (one describe for every
        lease the triggerer watches on this provider), then ``check`` in a thread (the
        heartbeat, the failure timeout, closing the attempt), batched with the other
        triggers' checks of the same poll into one hop."""
        spec, lease = self._spec(nxt), nxt.lease
        if lease is None:  # a "watch" step always carries its lease
            raise ValueError(f"job {nxt.record.job_id}: a watch step without a lease")
        transition = Transition(controller, spec)
        observer.watch(lease, self.poll_interval)
        try:
            after = time.time()
            while True:
                observed = await observer.wait_async(
                    lease.lease_id, after, wait_timeout(self.poll_interval)
                )
                nxt = await batched.to_thread(controller.check, spec, nxt, observed=observed)
                self._current = nxt
                if adopts(nxt):
                    # a handover: adopt the replacement launched on the notice and watch
                    # it here, without waking a worker
                    step = await batched.to_thread(transition.follow, nxt)
                    nxt = self._current = step.next
                    if step.adopted:
                        observer.unwatch(lease.lease_id)
                        lease = step.lease
                        observer.watch(lease, self.poll_interval)
                        after = time.time()
                        continue
                if nxt.action != "watch":
                    return "ended"
                if self.return_on_notice and nxt.notice_at is not None and not _handing_over(nxt):
                    return "notice"
                after = observed.at + self.poll_interval / 2  # the next poll's, not this one
        finally:
            observer.unwatch(lease.lease_id)

    # -- kill safety -------------------------------------------------------------------------
    async def on_kill(self) -> None:
        """Airflow 3.3: the user marked the deferred task failed/success or cleared it."""
        await self._stop_lease()

    async def cleanup(self) -> None:
        """Runs on every exit, triggerer restarts included: stop the lease only when the
        task instance has left ``deferred`` (on Airflow < 3.3, the only kill hook)."""
        if self._done or self._watched() is None:
            return
        try:
            state = await self._task_state()
        except Exception:  # noqa: BLE001 - unknown: keep the lease (the heartbeat is the backstop)
            self.log.warning(
                "could not read the task state; leaving the lease running", exc_info=True
            )
            return
        if state is not None and str(state) != "deferred":
            self.log.info("task instance is %s, no longer deferred: stopping its lease", state)
            await self._stop_lease()

    def _watched(self) -> Next | None:
        nxt = self._current
        if nxt is None or nxt.action != "watch" or nxt.record.current_attempt is None:
            return None
        return nxt

    async def _stop_lease(self) -> None:
        nxt = self._watched()
        if self._done or nxt is None:
            return
        self._done = True
        self.log.warning(
            "stopping lease %s of job %s: %s",
            nxt.lease and nxt.lease.lease_id,
            nxt.record.job_id,
            KILLED,
        )
        await asyncio.to_thread(
            lambda: self._controller().stop(self._spec(nxt), nxt.record, KILLED)
        )

    async def _task_state(self) -> str | None:
        """The task instance's state through the Task SDK (None without a task instance)."""
        ti = self.task_instance
        if ti is None:
            return None
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = await asyncio.to_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=ti.dag_id,
            task_ids=[ti.task_id],
            run_ids=[ti.run_id],
            map_index=ti.map_index,
        )
        key = (
            f"{ti.task_id}_{ti.map_index}"
            if ti.map_index is not None and ti.map_index >= 0
            else ti.task_id
        )
        return (states.get(ti.run_id) or {}).get(key)


def _handing_over(nxt: Next) -> bool:
    """The notice is already answered: the controller launched the replacement, which this
    trigger adopts and watches once the old lease ends (no worker needed for that)."""
    running = nxt.record.current_attempt
    return running is not None and running.replacement is not None
