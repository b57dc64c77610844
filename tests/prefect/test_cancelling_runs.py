"""A worker's watched flow runs are checked for cancellation with one read for all of them,
against a real Prefect server: the cancelled ones (and only they) are reported, and a
second question within the interval is answered without another read. The server sends
back only the runs being cancelled, so a read of hundreds of running runs stays small."""

from __future__ import annotations

import uuid

import anyio
from prefect import flow, get_client
from prefect.states import Cancelled, Cancelling, Completed, Running

from prefect_spot.workers.cancelling import CancellingRuns


@flow
def _idle() -> None:  # never run: its flow runs only exist on the server
    pass


def test_one_read_answers_every_watched_run(prefect_api):
    async def scenario():
        async with get_client() as client:
            runs = [await client.create_flow_run(_idle, state=Running()) for _ in range(5)]
            await client.set_flow_run_state(runs[2].id, Cancelling(), force=True)
            reads = []
            original = client.read_flow_runs

            async def counted(**kwargs):
                reads.append(kwargs)
                return await original(**kwargs)

            client.read_flow_runs = counted
            checker = CancellingRuns(interval=60.0)
            for run in runs:
                checker.watch(run.id)
            answers = [await checker.is_cancelling(client, run.id) for run in runs]
            unknown = await checker.is_cancelling(client, uuid.uuid4())
            return answers, unknown, len(reads)

    answers, unknown, reads = anyio.run(scenario)
    assert answers == [False, False, True, False, False]
    assert unknown is False
    assert reads == 1


def test_cancelled_runs_are_found_past_the_first_page_and_the_answer_holds_only_them(prefect_api):
    async def scenario():
        async with get_client() as client:
            runs = [await client.create_flow_run(_idle, state=Running()) for _ in range(205)]
            await client.set_flow_run_state(runs[3].id, Cancelled(), force=True)
            await client.set_flow_run_state(runs[202].id, Cancelling(), force=True)
            await client.set_flow_run_state(runs[204].id, Completed(), force=True)
            answered = []
            original = client.read_flow_runs

            async def counted(**kwargs):
                answer = await original(**kwargs)
                answered.append(len(answer))
                return answer

            client.read_flow_runs = counted
            checker = CancellingRuns(interval=60.0)
            for run in runs:
                checker.watch(run.id)
            flagged = [
                i for i, run in enumerate(runs) if await checker.is_cancelling(client, run.id)
            ]
            return flagged, answered

    flagged, answered = anyio.run(scenario)
    assert flagged == [3, 202]
    assert answered == [1, 1]  # two pages of ids, each answered with its one ending run
