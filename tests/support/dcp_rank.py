"""One rank of a distributed checkpoint test: real torch.distributed (gloo, CPU).

Started by tests/core/test_checkpoint_dcp.py with phases ``[WORLD, MODE, STORE_URI, STEP,
ATTEMPT, OUT]``:
it imports torch once and forks one process per rank (an import per rank costs seconds
on a loaded machine) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, what torchrun
and the multi-node provider set. Like torchrun, when a rank dies the launcher ends the
others (after a grace period). It prints one JSON list per phase: each rank's report
and exit code. The state is one weight sharded by rows across the
ranks (a DTensor, what FSDP2 holds), one replicated bias and a plain value, so a save
at 4 ranks and a load at 2 or 1 exercise DCP's resharding.

Modes: ``save``, ``async_save``, ``load`` (rank 0 writes the full state to OUT),
``save_die`` (rank 2 dies by SIGKILL half-way through writing its part), and
``save_fenced`` (rank 0 raises the fence to ATTEMPT + 1 after writing its part, as
the controller does on a handover, so the commit meets a newer attempt).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from spot_core.checkpoint import open_store
from spot_core.checkpoint.torch_dcp import StoreReader, StoreWriter

ROWS, COLS = 16, 4
VICTIM = 2


def full_state(step: int) -> dict:
    """The whole state a save at ``step`` holds, as plain tensors (the test's expectation)."""
    return {
        "w": torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) + step,
        "b": torch.arange(COLS, dtype=torch.float32) * step,
        "meta": {"step": step},
    }


def _sharded(state: dict, world: int) -> dict:
    """``w`` sharded by rows across the ranks; at world size 1 the plain tensors."""
    if world == 1:
        return state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    return {**state, "w": distribute_tensor(state["w"], mesh, [Shard(0)])}


class _DyingPart:
    """A part source that gives half its bytes, then kills this process (no cleanup)."""

    def __init__(self) -> None:
        self.calls = 0

    def read(self, size: int = -1) -> bytes:
        self.calls += 1
        if self.calls > 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return b"x" * 4096


class DyingWriter(StoreWriter):
    def write_data(self, plan, planner):
        if dist.get_rank() == VICTIM:
            version = plan.storage_data
            self.store.write_part(version.checkpoint_id, version.part, _DyingPart())
        return super().write_data(plan, planner)


class HandoverWriter(StoreWriter):
    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        if dist.get_rank() == 0:
            self.store.fence(self.attempt + 1)  # the replacement started meanwhile
        dist.barrier()  # every part is written before the coordinator commits
        return written


def rank_main(mode: str, uri: str, step: int, attempt: int, out: str, report: str) -> None:
    world = int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    store = open_store(uri)
    no_dist = world == 1
    result: dict = {"rank": int(os.environ["RANK"])}
    try:
        if mode == "load":
            zero = {"w": torch.zeros(ROWS, COLS), "b": torch.zeros(COLS), "meta": {"step": -1}}
            state = _sharded(zero, world)
            dcp.load(state, storage_reader=StoreReader(store), no_dist=no_dist)
            w = state["w"].full_tensor() if world > 1 else state["w"]
            if result["rank"] == 0:
                torch.save({"w": w, "b": state["b"], "meta": state["meta"]}, out)
        else:
            state = _sharded(full_state(step), world)
            writer_class = {"save_die": DyingWriter, "save_fenced": HandoverWriter}.get(
                mode, StoreWriter
            )
            writer = writer_class(store, step, attempt=attempt, keep=3)
            if mode == "async_save":
                dcp.async_save(state, storage_writer=writer).result()
            else:
                dcp.save(state, storage_writer=writer, no_dist=no_dist)
            if writer.ref is not None:
                result["committed"] = writer.ref.checkpoint_id
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is one; asserted
        result["ok"], result["error"] = False, f"{type(exc).__name__}: {exc}"[:2000]
    with open(report, "w") as fh:
        json.dump(result, fh)
    os._exit(0)  # no teardown collectives with a peer that may be gone


def _run_rank(rank: int, world: int, port: int, args: list[str], report: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    mode, uri, step, attempt, out = args
    rank_main(mode, uri, int(step), int(attempt), out, report)


def launch(world: int, args: list[str], grace_seconds: float = 10.0) -> list[dict]:
    import multiprocessing
    import socket
    import tempfile
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="dcp-ranks-")
    reports = [os.path.join(folder, f"rank{rank}.json") for rank in range(world)]
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(target=_run_rank, args=(rank, world, port, args, reports[rank]))
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    failed_at = None
    deadline = time.monotonic() + 150
    while any(p.is_alive() for p in ranks) and time.monotonic() < deadline:
        if failed_at is None and any(p.exitcode not in (None, 0) for p in ranks):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_seconds:
            break
        time.sleep(0.05)
    for process in ranks:
        if process.is_alive():
            process.kill()
        process.join()
    results = []
    for rank, process in enumerate(ranks):
        try:
            with open(reports[rank]) as fh:
                report = json.load(fh)
        except (OSError, ValueError):
            report = None
        results.append({"rank": rank, "exitcode": process.exitcode, "report": report})
    return results


def main() -> None:
    """Each argument a JSON phase ``[world, mode, uri, step, attempt, out]``, run in turn
    (a save at 4 ranks, then a load at 2) from one import of torch."""
    phases = [json.loads(arg) for arg in sys.argv[1:]]
    reports = [launch(int(world), [str(a) for a in args]) for world, *args in phases]
    print(json.dumps(reports), flush=True)


if __name__ == "__main__":
    main()
