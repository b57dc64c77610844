"""Foundation benchmark: checkpoint save throughput and notice-detection latency.

1. File-store save of a 256 MiB payload, as a ratio to a plain write + fsync of the
   same bytes to the same disk (aim: >= 0.8), with the default digest (blake3) and with
   sha256 (what 0.1 recorded, still readable). Trials rotate plain / store / store-sha256
   so that all see the same disk and page-cache conditions; the median of each is reported.
2. Notice-detection latency with a 1 s poll against the metadata emulator over HTTP
   (aim: <= poll + 0.2 s), from the moment the emulator serves the notice to the
   moment the watcher's handler runs.

Run: `make bench` (or `python -m bench.foundation --help`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from spot_core.checkpoint import open_store
from spot_core.checkpoint.digests import DEFAULT_DIGEST
from spot_emulators.notice_latency import measure_detection_latency

MIB = 1024 * 1024


def _plain_write(path: Path, data: bytes) -> float:
    started = time.perf_counter()
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - started


def _store_save(root: Path, data: bytes, step: int, digest: str = DEFAULT_DIGEST) -> float:
    store = open_store(root.resolve().as_uri())
    store.digest = digest
    started = time.perf_counter()
    store.save(step=step, payload={"blob": data})
    return time.perf_counter() - started


def bench_save(size_mib: int, trials: int, where: Path) -> dict:
    data = os.urandom(size_mib * MIB)
    plain, stored, stored_sha256 = [], [], []
    for trial in range(trials):
        scratch = Path(tempfile.mkdtemp(prefix="spot-bench-", dir=where))
        try:
            plain.append(_plain_write(scratch / "plain.bin", data))
            stored.append(_store_save(scratch / "store", data, trial))
            stored_sha256.append(_store_save(scratch / "store-sha256", data, trial, "sha256"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    plain_mbps = size_mib / statistics.median(plain)
    store_mbps = size_mib / statistics.median(stored)
    sha256_mbps = size_mib / statistics.median(stored_sha256)
    return {
        "payload_mib": size_mib,
        "trials": trials,
        "digest": DEFAULT_DIGEST,
        "plain_write_fsync_mib_s": round(plain_mbps, 1),
        "file_store_save_mib_s": round(store_mbps, 1),
        "ratio": round(store_mbps / plain_mbps, 3),
        "aim_ratio_at_least": 0.8,
        "file_store_save_sha256_mib_s": round(sha256_mbps, 1),
        "ratio_sha256": round(sha256_mbps / plain_mbps, 3),
    }


def bench_latency(poll_interval: float, trials: int) -> dict:
    samples = measure_detection_latency(poll_interval=poll_interval, trials=trials)
    return {
        "poll_interval_s": poll_interval,
        "trials": trials,
        "median_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
        "aim_at_most_s": round(poll_interval + 0.2, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--save-trials", type=int, default=5)
    parser.add_argument("--latency-trials", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="a folder on the disk to measure (default: the current folder)",
    )
    args = parser.parse_args(argv)
    save = bench_save(args.size_mib, args.save_trials, args.dir)
    print(
        f"checkpoint save, {save['payload_mib']} MiB: file store {save['file_store_save_mib_s']} "
        f"MiB/s vs plain write+fsync {save['plain_write_fsync_mib_s']} MiB/s -> ratio "
        f"{save['ratio']} (aim >= 0.8); with sha256 {save['file_store_save_sha256_mib_s']} "
        f"MiB/s -> ratio {save['ratio_sha256']}",
        flush=True,
    )
    latency = bench_latency(args.poll_interval, args.latency_trials)
    print(
        f"notice detection, poll {latency['poll_interval_s']} s: median {latency['median_s']} s, "
        f"max {latency['max_s']} s (aim <= {latency['aim_at_most_s']} s)",
        flush=True,
    )
    print(json.dumps({"checkpoint_save": save, "notice_detection": latency}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
