"""The flow-run command on a spot lease: Prefect's engine, with a preemption handed back.

``python -m prefect_spot._engine [FLOW_RUN_ID]`` runs ``python -m prefect.engine`` in
this process (its main thread, so a ``spot_task`` can turn SIGTERM into an emergency
checkpoint). One difference: when a ``spot_task`` ends the run because the capacity
itself is going away (:func:`relinquish`), the engine must not report the flow run
``Failed`` or ``Crashed``. A final state would fire every automation on failures, and
the spot worker would only overwrite it with ``AwaitingRetry`` a second later. So the
task commits Prefect's own ``relinquish`` intent (what ``prefect flow-run execute``
commits when ``PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=relinquish``: "leave the next
state to retrying infrastructure") and raises ``TerminationSignal``. The flow engine
then ends the run without proposing a state, and the worker, seeing a reclaimed lease,
puts it back as ``AwaitingRetry``. Prefect's engine exits 0 after a relinquished run;
here the process exits ``PREEMPTED_EXIT_CODE`` instead, so nothing downstream can read
a preemption as success.

A flow that does not use ``spot_task`` gets the same: the watcher's SIGTERM reaches
Prefect's own SIGTERM bridge (``capture_sigterm``), and :func:`main` has that bridge go
through :func:`relinquish` first, so a reclaim notice hands the run back there too
rather than end it ``Crashed``. Any other SIGTERM (a cancellation, a lost worker, a
plain ``kill``) still ends the run as Prefect would.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import time
from typing import NoReturn
from uuid import UUID

from spot_core.attempt_env import (
    INFRASTRUCTURE_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    AttemptEnv,
    positive_seconds,
)
from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.interruption.base import INTERRUPTION, parse_rfc3339
from spot_core.interruption.notice_file import read_notice

GO_MARGIN = "SPOT_HANDOVER_GO_MARGIN"
"""Seconds past the notice's deadline a replacement waits for the worker's go (the
worker sets it from its poll interval)."""
DEFAULT_GO_MARGIN_SECONDS = 60.0
GO_POLL_SECONDS = 0.2
STATE_CHECK_SECONDS = 2.0  # how often the wait reads the flow run's state (a cancel)
NOT_STARTED_EXIT_CODE = 1
EXIT_MARGIN_SECONDS = 0.25  # a relinquished engine ends itself this long before the deadline

_running = False  # this process's entry point is main() below
_relinquished = False


def relinquish(cause: BaseException) -> NoReturn:
    """End the flow run without a final state, leaving the next one to the spot worker.

    Raises ``TerminationSignal`` (from ``cause``) after committing Prefect's
    ``relinquish`` intent, when the spot watcher's notice file holds a reclaim notice.
    Re-raises ``cause`` (the run ends ``Failed``, as a task's error) where handing the run
    back would be unsafe or impossible: for any other notice (``driver_lost`` means no
    worker watches the run any more, so a run left ``Running`` would stay so), outside
    this entry point (under ``python -m prefect.engine`` a relinquished run exits 0, which
    reads as success), or on a Prefect without the intent (its control listener came
    with 3.9).
    """
    global _relinquished
    try:
        notice = read_notice() or {}
    except (OSError, ValueError):  # unreadable: not known to be a reclaim
        notice = {}
    if not _running or notice.get("event") != INTERRUPTION:
        raise cause
    try:
        from prefect._internal import control_listener
        from prefect.exceptions import TerminationSignal

        set_intent = control_listener._set_intent
    except (ImportError, AttributeError):
        raise cause from None
    set_intent("relinquish")
    _relinquished = True
    _exit_by_deadline(notice.get("deadline"))
    raise TerminationSignal(signal.SIGTERM) from cause


def _exit_by_deadline(deadline_text: object) -> None:
    """Have the kernel end this process just before the notice's deadline (SIGALRM, whose
    default action needs no Python), should Prefect's teardown still run then.

    Why: after a relinquish Prefect still marks the task run ``Crashed``, ends the flow
    engine and flushes its logs and events at exit: 1.1 to 1.4 s after the emergency save
    on a loaded machine, where a compressed trace's notice leaves 1 to 2 s in all, so the
    spot watcher SIGKILLed the engine for outliving its notice ("outlived its notice
    deadline: SIGKILL"). By now the emergency checkpoint is committed and the task's
    record written; what the teardown has left is Prefect's bookkeeping, which the worker
    redoes (the run's next state). A timer thread cannot do this: the interpreter's
    shutdown, where the teardown ends, no longer runs it."""
    try:
        deadline = parse_rfc3339(deadline_text)
    except ValueError:  # no deadline given: the watcher's grace bounds the teardown
        return
    with contextlib.suppress(ValueError):  # not the main thread: SIGALRM is left as it is
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.time() - EXIT_MARGIN_SECONDS))


def _hand_back_on_reclaim(sig_num: int, *_frame: object) -> NoReturn:
    """Prefect's SIGTERM bridge, with a reclaim notice turned into ``relinquish``."""
    from prefect.exceptions import TerminationSignal

    relinquish(TerminationSignal(signal=sig_num))


def _bridge_sigterm_through_relinquish() -> None:
    """Make the handler Prefect installs for SIGTERM ours (it looks the handler up by
    name when the flow engine starts, and compares against the same name later). A
    Prefect without that name keeps its own handler: plain flows then show ``Crashed``
    before the worker reschedules them, as before."""
    try:
        import prefect.utilities.engine as engine_utils
    except ImportError:
        return
    if callable(getattr(engine_utils, "_prefect_sigterm_handler", None)):
        engine_utils._prefect_sigterm_handler = _hand_back_on_reclaim


def _flow_run_id() -> str:
    return sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PREFECT__FLOW_RUN_ID", "")


def _flow_run_state(flow_run_id: UUID):
    """The flow run's state now, or None when the API did not answer (tried again)."""
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(flow_run_id).state
    except Exception as exc:  # noqa: BLE001 - a blip: the next check reads it again
        print(f"handover: could not read flow run {flow_run_id}: {exc}", file=sys.stderr)
        return None


def _verdict(state, go: bool) -> str | None:
    """Why the engine must not start (the flow run's state says so); "" to start it now;
    None to wait on."""
    if state is not None and (state.is_cancelling() or state.is_final()):
        return f"is {state.name}: it was stopped while its replacement waited"
    if not go or state is None:
        return None
    return "" if state.is_pending() else f"is {state.name}, not Pending, at the worker's go"


def _not_started(reason: str, code: int) -> int:
    print(f"error: {reason}; the flow run's engine was not started", file=sys.stderr, flush=True)
    return code


def _go_limit(env: AttemptEnv, started: float) -> float:
    """When the wait for the go ends: the notice's deadline plus the worker's margin, at
    most a day from ``started``."""
    from spot_core.checkpoint.handover import DEFAULT_NOTICE_SECONDS

    margin = positive_seconds(os.environ.get(GO_MARGIN), GO_MARGIN, example="60")
    deadline = env.handover_deadline or started + DEFAULT_NOTICE_SECONDS
    return min(deadline + (margin or DEFAULT_GO_MARGIN_SECONDS), started + MAX_WAIT_SECONDS)


def await_go(env: AttemptEnv, flow_run_id: str, *, clock=time.time, sleep=time.sleep) -> int | None:
    """Wait for the worker's go to start the flow run's engine as ``env.attempt``, the
    replacement of ``env.handover_from``; None to start, else the exit code (one line on
    stderr says why the engine was not started)."""
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.handover import read_go

    old, attempt = env.handover_from, env.attempt
    if old is None or env.checkpoint_uri is None:
        return None
    try:
        run_id = UUID(flow_run_id)
    except ValueError:
        raise ValueError(f"flow run id {flow_run_id[:40]!r} is not a UUID") from None
    started = clock()
    limit = _go_limit(env, started)
    import prefect.flow_engine  # noqa: F401 - the slow part of a start, done while waiting

    store, next_check = open_store(env.checkpoint_uri), started
    while True:
        go = read_go(store, old, attempt) is not None
        now = clock()
        if go or now >= next_check:  # the state on the go, and every few seconds (a cancel)
            next_check = now + STATE_CHECK_SECONDS
            verdict = _verdict(_flow_run_state(run_id), go)
            if verdict == "":
                return None
            if verdict:
                return _not_started(f"flow run {flow_run_id} {verdict}", NOT_STARTED_EXIT_CODE)
        if now >= limit:
            return _not_started(
                f"attempt {attempt} waited {now - started:.0f} s for the spot worker's go to "
                f"take over flow run {flow_run_id} from attempt {old} and got none (is the "
                "worker running?)",
                INFRASTRUCTURE_EXIT_CODE,
            )
        sleep(GO_POLL_SECONDS)


def main() -> int:
    """Run Prefect's engine module as ``__main__``; its exit code, or the preemption's.

    A handover's replacement first waits for the spot worker's go (:func:`await_go`)."""
    global _running
    try:
        waited = await_go(AttemptEnv.from_environ(), _flow_run_id())
    except Exception as exc:  # noqa: BLE001 - one line, and no engine started
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return INFRASTRUCTURE_EXIT_CODE
    if waited is not None:
        return waited
    _running = True
    _bridge_sigterm_through_relinquish()
    try:  # alter_sys: sys.argv[0] is prefect.engine's own path, as under -m
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return PREEMPTED_EXIT_CODE if _relinquished else code


if __name__ == "__main__":
    # Run the imported module's main, so that relinquish() and main() share one module
    # object (under -m this file also runs as __main__, a second copy).
    from prefect_spot._engine import main as _main

    sys.exit(_main())
