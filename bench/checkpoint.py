"""Large checkpoints: the loop's stall per save, sync against async; save and restore
throughput against the raw transfer: ``make bench-checkpoint`` (issue 47 item 5).

    make bench-checkpoint                          # 1 GiB and 4 GiB, file store and S3
    python -m bench.checkpoint --gib 0.25          # a quick look
    BENCH_CHECKPOINT_GIB=0.5 make bench-checkpoint # the same, through make

Side by side in one run, for each state size on a file store and on S3 (moto in server
mode on this machine), one row each:

- **stall per save**: what ``maybe_save`` costs the training loop. The state is float32
  CPU tensors (eight of them) saved through ``torch_state.staged_torch_payload``. Sync
  (``background=False``): stage, serialise (``torch.save``) and write, all before the next
  step. Async (``background=True``): the tensors copied to host memory (into the staging
  buffers the previous save used), then the loop goes on; the upload's own time (hand-over
  to commit) is reported beside it. Each is the second save of its checkpointer (the first
  allocates and writes the attempt's resume report). Aim: async stall
  at most 0.1x the sync one.
- **save throughput**: ``store.save`` of the serialised bytes (one file) against the raw
  transfer of the same bytes to the same place: a plain ``write`` + ``fsync`` into the
  store's directory, or boto3's ``upload_fileobj`` with its defaults. Aim: at least 0.8x.
- **restore throughput**: ``store.load`` of that checkpoint (``fetch.py``: on S3 the file
  read in 16 MiB ranges on 8 threads, digest fed as they land) and with ``workers=1`` (one
  whole read, the previous path), against the raw read (the file read whole, or one boto3
  ``get_object``).
- DCP sharded saves at 1, 2 and 4 ranks: ``bench/checkpoint_dcp.py`` (its own table, run
  after this one by ``make bench-checkpoint``).

Each figure is one run (sizes in GiB take tens of seconds each here); the machine is shared
(2 cores, other engineers' suites beside it), so read the ratios, not the absolutes. Writes
bench/tables/checkpoint.md and prints one JSON object per row.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

GiB = 1 << 30
TABLES = Path(__file__).with_name("tables")
BUCKET = "bench-checkpoint"
TENSORS = 8
SIZE_ENV = "BENCH_CHECKPOINT_GIB"
MOTO_READ_TIMEOUT_SECONDS = 600.0


def state_of(size_bytes: int) -> dict[str, Any]:
    """A model's state: ``TENSORS`` float32 tensors of ``size_bytes`` in all."""
    import torch

    each = size_bytes // TENSORS // 4
    return {f"layer{i}.weight": torch.rand(each) for i in range(TENSORS)}


def stalls(store_uri: str, state: dict[str, Any]) -> dict[str, float]:
    """Seconds ``maybe_save`` held the loop, sync then async; the async upload's seconds."""
    from spot_core.checkpoint import Checkpointer
    from spot_core.checkpoint.torch_state import StagedState

    def payload() -> dict[str, Any]:
        return {"model.pt": StagedState(state)}

    sync = Checkpointer(_open(store_uri), every_steps=1, keep=1)
    sync.maybe_save(1, payload)  # the first: the resume report, buffers allocated; untimed
    started = time.perf_counter()
    sync.maybe_save(2, payload)
    sync_s = time.perf_counter() - started
    background = Checkpointer(_open(store_uri), every_steps=1, keep=1, background=True)
    background.maybe_save(3, payload)
    background.wait_for_save()
    started = time.perf_counter()
    background.maybe_save(4, payload)
    async_s = time.perf_counter() - started
    for tensor in state.values():
        tensor.add_(1.0)  # the loop goes on, changing its state while the upload runs
    background.close()
    return {
        "sync_stall_s": sync_s,
        "async_stall_s": async_s,
        "async_upload_s": background.last_upload_seconds,
    }


def serialised(state: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def file_raw(root: Path, data: bytes) -> tuple[float, float]:
    """Seconds for a plain write + fsync of ``data`` into ``root``, and to read it back."""
    path = root / "raw.bin"
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as fh:
        view = memoryview(data)
        while view:
            view = view[fh.write(view) :]
        os.fsync(fh.fileno())
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        fh.readall()
    read_s = time.perf_counter() - started
    path.unlink()
    return write_s, read_s


def s3_raw(endpoint: str, data: bytes) -> tuple[float, float]:
    """Seconds for boto3's ``upload_fileobj`` of ``data`` (its defaults: 8 MiB parts, 10
    threads) and for one plain ``get_object`` read of it back (``download_fileobj`` reads
    8 MiB ranges, and moto reads the whole object to serve each: quadratic here)."""
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    started = time.perf_counter()
    s3.upload_fileobj(
        io.BytesIO(data), BUCKET, "raw.bin", ExtraArgs={"ServerSideEncryption": "AES256"}
    )
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    s3.get_object(Bucket=BUCKET, Key="raw.bin")["Body"].read()
    read_s = time.perf_counter() - started
    s3.delete_object(Bucket=BUCKET, Key="raw.bin")
    return write_s, read_s


def throughputs(store_uri: str, data: bytes) -> dict[str, float]:
    """``store.save`` of ``data`` and ``store.load`` of it, 8 threads and 1, in seconds."""
    store = _open(store_uri)
    started = time.perf_counter()
    ref = store.save(10, {"model.pt": data})
    save_s = time.perf_counter() - started
    store.prune(keep=1)
    timings = {"save_s": save_s}
    for name, workers in (("restore_s", 8), ("restore_1_thread_s", 1)):
        fresh = _open(store_uri)  # nothing cached
        started = time.perf_counter()
        loaded = fresh.load(ref, workers=workers)
        timings[name] = time.perf_counter() - started
        assert loaded["model.pt"] == data
        del loaded
        gc.collect()
    return timings


def _open(uri: str) -> Any:
    """The store at ``uri``; on S3 with a read timeout of ``MOTO_READ_TIMEOUT_SECONDS``:
    moto assembles a completed multipart upload before it answers, sending nothing (S3
    sends whitespace meanwhile), which took over the store's 20 s read timeout for 1 GiB
    on this loaded machine; botocore's retry then found the upload gone (500)."""
    from spot_core.adaptors import aws
    from spot_core.checkpoint import open_store

    if not uri.startswith("s3://"):
        return open_store(uri)
    client = aws.shared_client(
        "s3",
        region="us-east-1",
        endpoint_url=os.environ["SPOT_S3_ENDPOINT_URL"],
        max_pool_connections=12,
        retry_attempts=5,
        read_timeout_seconds=MOTO_READ_TIMEOUT_SECONDS,
    )
    return open_store(uri, client=client, call_deadline_seconds=MOTO_READ_TIMEOUT_SECONDS)


def run_case(kind: str, gib: float, work: Path, endpoint: str | None) -> dict[str, Any]:
    size = int(gib * GiB)
    if kind == "file":
        root = work / f"file-{gib:g}"
        root.mkdir(parents=True, exist_ok=True)
        uri = root.as_uri()
    else:
        uri = f"s3://{BUCKET}/gib-{gib:g}"
    state = state_of(size)
    row: dict[str, Any] = {"store": kind, "gib": gib, **stalls(uri, state)}
    data = serialised(state)
    del state
    gc.collect()
    row.update(throughputs(uri, data))
    raw_write_s, raw_read_s = (
        file_raw(work / f"file-{gib:g}", data) if kind == "file" else s3_raw(endpoint or "", data)
    )
    row.update(raw_write_s=raw_write_s, raw_read_s=raw_read_s, bytes=len(data))
    return _rounded(row)


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    gib = row["bytes"] / GiB
    row["async_over_sync"] = row["async_stall_s"] / row["sync_stall_s"]
    row["save_gib_s"] = gib / row["save_s"]
    row["raw_write_gib_s"] = gib / row["raw_write_s"]
    row["save_over_raw"] = row["raw_write_s"] / row["save_s"]
    row["restore_gib_s"] = gib / row["restore_s"]
    row["restore_1_thread_gib_s"] = gib / row["restore_1_thread_s"]
    row["raw_read_gib_s"] = gib / row["raw_read_s"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| store | state GiB | sync stall s | async stall s | async / sync | async upload s "
        "| save MiB/s | raw write MiB/s | save / raw | restore MiB/s (8 threads) "
        "| restore MiB/s (1 thread) | raw read MiB/s | aims (async <= 0.1x, save >= 0.8x) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "file" if r["store"] == "file" else "S3 (moto)"
        raw = "write+fsync" if r["store"] == "file" else "upload_fileobj"
        aims = (
            f"{'yes' if r['async_over_sync'] <= 0.1 else 'no'} / "
            f"{'yes' if r['save_over_raw'] >= 0.8 else 'no'}"
        )
        lines.append(
            f"| {name} | {r['gib']:g} | {r['sync_stall_s']:.2f} | {r['async_stall_s']:.2f} | "
            f"{r['async_over_sync']:.3f} | {r['async_upload_s']:.2f} | {_mib(r['save_gib_s'])} | "
            f"{_mib(r['raw_write_gib_s'])} ({raw}) | {r['save_over_raw']:.2f} | "
            f"{_mib(r['restore_gib_s'])} | {_mib(r['restore_1_thread_gib_s'])} | "
            f"{_mib(r['raw_read_gib_s'])} | {aims} |"
        )
    return "\n".join(lines) + "\n"


def _mib(gib_per_s: float) -> str:
    return f"{gib_per_s * 1024:.0f}"


def moto() -> contextlib.AbstractContextManager[str]:
    from spot_emulators.moto_server import moto_s3_bucket

    return moto_s3_bucket(BUCKET)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__)
    default = [float(g) for g in os.environ.get(SIZE_ENV, "1,4").split(",")]
    parser.add_argument("--gib", type=float, nargs="+", default=default, help="state sizes")
    parser.add_argument("--stores", nargs="+", choices=("file", "s3"), default=["file", "s3"])
    parser.add_argument("--out", type=Path, default=TABLES / "checkpoint.md")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as scratch:
        with contextlib.ExitStack() as stack:
            endpoint = stack.enter_context(moto()) if "s3" in args.stores else None
            for gib in args.gib:
                for kind in args.stores:
                    rows.append(run_case(kind, gib, Path(scratch), endpoint))
                    print(json.dumps(rows[-1]), flush=True)
                    gc.collect()
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
