"""DCP sharded saves through ``StoreWriter`` at 1, 2 and 4 ranks (gloo, CPU, one process
per rank), side by side in one run: the save's wall time (barrier to barrier, commit
included) and its throughput for a state of ``--mib`` MiB split evenly over the ranks::

    .venv-core/bin/python -m bench.checkpoint_dcp --mib 256 --stores file s3
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import tempfile
import time
from typing import Any

from bench.checkpoint import BUCKET, moto


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, world: int, port: int, uri: str, mib: int, out: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from bench.checkpoint import _open
    from spot_core.checkpoint.torch_dcp import StoreWriter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        floats = (mib << 20) // 4 // world
        state = {f"shard_{rank}": torch.rand(floats)}
        dist.barrier()
        started = time.perf_counter()
        dcp.save(state, storage_writer=StoreWriter(_open(uri), step=world))
        dist.barrier()
        if rank == 0:
            out.put(time.perf_counter() - started)
    finally:
        dist.destroy_process_group()


def save_seconds(world: int, uri: str, mib: int) -> float:
    """One sharded save at ``world`` ranks, each rank its own process."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, uri, mib, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    seconds = float(out.get(timeout=600))
    for proc in procs:
        proc.join(60)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_dcp", description=__doc__)
    parser.add_argument("--mib", type=int, default=256, help="total state size, MiB")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stores", nargs="+", choices=("file", "s3"), default=["file", "s3"])
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-dcp-") as work, contextlib.ExitStack() as stack:
        if "s3" in args.stores:
            stack.enter_context(moto())
        for kind in args.stores:
            cells = []
            for world in args.ranks:
                root = f"file://{work}" if kind == "file" else f"s3://{BUCKET}"
                seconds = save_seconds(world, f"{root}/dcp-{world}", args.mib)
                cells.append(f"{world}: {seconds:.2f} s, {args.mib / seconds:.0f} MiB/s")
            print(
                f"| DCP sharded save {args.mib} MiB, {kind} store (gloo, CPU) | "
                + " / ".join(cells)
                + f" | load average {os.getloadavg()[0]:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
