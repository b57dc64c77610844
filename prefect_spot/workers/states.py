"""The spot worker's changes to a flow run's Prefect state, and the reads they depend on.

Each takes the worker's Prefect client: a preempted run is put back in the queue
(``AwaitingRetry``) with the flow retries its runs used given back; a handover puts it
back to ``Pending`` for the replacement's engine; a cancel stays a cancel; a job that
ended without success fails the run unless the engine already settled it; a worker that
stops while it drives a run leaves it ``Crashed``, not ``Pending`` or ``Running``.
"""

from __future__ import annotations

from typing import Any

from prefect.client.schemas.objects import FlowRun

from spot_core.model import Attempt, JobRecord


def related(flow_run: FlowRun) -> list[dict[str, str]]:
    """The flow run as the related resource of the job's events."""
    return [
        {
            "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
            "prefect.resource.role": "flow-run",
        }
    ]


async def completed(client: Any, flow_run: FlowRun) -> bool:
    """Whether Prefect already has the flow run in a Completed state."""
    current = await client.read_flow_run(flow_run.id)
    return current.state is not None and current.state.is_completed()


async def runs_before(client: Any, flow_run: FlowRun, record: JobRecord) -> int:
    """The flow run's ``run_count`` before the runs of the attempt this worker drives.

    For an attempt this worker is about to launch, the count now. For one already open
    (an orphan adopted, or a restarted worker driving its run again), its flow has
    started since its worker submitted it: the count minus the ``Running`` states since
    the last ``Pending``, so those runs are given back too if the attempt is preempted.
    """
    from prefect.client.schemas.objects import StateType

    current = await client.read_flow_run(flow_run.id)
    if record.current_attempt is None:
        return current.run_count
    since_pending = 0
    for state in await client.read_flow_run_states(flow_run.id):  # oldest first
        if state.type == StateType.PENDING:
            since_pending = 0
        elif state.type == StateType.RUNNING:
            since_pending += 1
    return max(0, current.run_count - since_pending)


async def refund_flow_retries(client: Any, flow_run: FlowRun, runs_before: int) -> int:
    """Give back the flow's ``retries`` that the preempted attempt's runs used up; the
    run's ``run_count`` now (the next attempt's ``runs_before``).

    Every start of a flow run raises its ``run_count``, and Prefect retries a failed
    flow run while ``run_count`` <= ``empirical_policy.retries`` (its
    RetryFailedFlows rule; the engine copies ``@flow(retries=...)`` there only while
    it is unset). Raising ``retries`` by the runs this attempt spent keeps the user's
    retries for the flow's own errors."""
    current = await client.read_flow_run(flow_run.id)
    spent = max(0, current.run_count - runs_before)
    policy = current.empirical_policy
    if spent == 0 or policy.retries is None:
        return current.run_count
    policy = policy.model_copy(update={"retries": policy.retries + spent})
    await client.update_flow_run(flow_run.id, empirical_policy=policy)
    return current.run_count


async def cancelled(client: Any, flow_run: FlowRun, since: float) -> bool:
    """Was the run cancelled since ``since`` (the attempt's start)? Then it stays so.

    Read from the run's state history, not its current state: the engine killed with
    its lease may have reported ``Crashed`` after the ``Cancelling``."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    history = await client.read_flow_run_states(flow_run.id)
    if not any(
        s.type in (StateType.CANCELLING, StateType.CANCELLED)
        and s.timestamp.timestamp() >= since - 1.0
        for s in history
    ):
        return False
    current = (await client.read_flow_run(flow_run.id)).state
    if current is None or not current.is_cancelled():
        await client.set_flow_run_state(
            flow_run.id,
            Cancelled(message="cancelled; its spot lease was terminated"),
            force=True,
        )
    return True


async def reschedule(
    client: Any, flow_run: FlowRun, record: JobRecord, last: Attempt, logger: Any
) -> None:
    """Put the flow run back in the queue instead of leaving it Crashed."""
    from prefect.states import AwaitingRetry

    step = record.latest_checkpoint.step if record.latest_checkpoint else None
    message = (
        f"spot capacity {last.outcome} on {last.pool.zone} {last.pool.instance_type} "
        f"(attempt {last.number}); rescheduled to resume from checkpoint step "
        f"{step if step is not None else '- (none yet)'}"
    )
    await client.set_flow_run_state(flow_run.id, AwaitingRetry(message=message), force=True)
    logger.info(message)
    from prefect_spot.events import emit_job_event

    emit_job_event("rescheduled", record, message, related=related(flow_run))


async def back_to_pending(client: Any, flow_run: FlowRun, message: str) -> None:
    """A handover: the run back to ``Pending``, the state the replacement's engine starts
    from (forced: Prefect refuses Running -> Pending to a worker, as a guard against a
    second submission, which is exactly what this is not: the old engine has exited and
    the record has closed its attempt)."""
    from prefect.states import Pending

    await client.set_flow_run_state(flow_run.id, Pending(message=message), force=True)


async def fail_unless_final(client: Any, flow_run: FlowRun, record: JobRecord) -> None:
    """The job ended without success: the run fails, unless its engine already gave it a
    final state (other than Crashed)."""
    from prefect.states import Failed

    current = await client.read_flow_run(flow_run.id)
    if current.state is not None and current.state.is_final() and not current.state.is_crashed():
        return
    await client.set_flow_run_state(
        flow_run.id,
        Failed(
            message=f"spot job ended {record.status}: "
            f"{record.attempts[-1].message if record.attempts else ''}"
        ),
        force=True,
    )


async def crash_if_left(client: Any, flow_run: FlowRun, logger: Any) -> None:
    """The worker stopped and ended the run's leases: a run they leave ``Pending`` or
    ``Running`` ends ``Crashed``, as a run whose infrastructure was lost does (a failure
    to say so is logged: the worker's own error is the one to raise)."""
    from prefect.states import Crashed

    try:
        current = await client.read_flow_run(flow_run.id)
        state = current.state
        if state is not None and (state.is_pending() or state.is_running()):
            await client.set_flow_run_state(
                flow_run.id,
                Crashed(
                    message="the spot worker stopped while it drove the flow run; "
                    "its spot leases were ended"
                ),
                force=True,
            )
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        logger.warning("could not mark the flow run Crashed", exc_info=True)
