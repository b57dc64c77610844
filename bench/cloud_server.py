"""200 clients at once against the local cloud server: how long each waits for its answer.

    python -m bench.cloud_server [--clients 200] [--rounds 3]

Side by side in one run: the server as it ships (listen backlog ``BACKLOG``) and the same
server with socketserver's default backlog of 5 (what it had before issue 35). Each round
starts ``--clients`` threads that each open a connection and ``GET /config`` at once (the
project client's 10 s timeout); printed: answered, timed out, and the latency p50 / p99 /
max in seconds. Results go in bench/README.md.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spot_core.localcloud import server as cloud_server
from spot_core.localcloud.client import TIMEOUT_SECONDS


def one_get(url: str, token: str) -> float | None:
    """Seconds until the whole answer came, or None (timed out, refused)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.perf_counter()
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_SECONDS) as sock:
            sock.sendall(
                f"GET /config HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                f"{token}\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return None
    return time.perf_counter() - started if answer.startswith(b"HTTP/1.0 200") else None


def one_round(backlog: int, clients: int) -> list[float | None]:
    original = cloud_server._Server.request_queue_size
    cloud_server._Server.request_queue_size = backlog
    try:
        with (
            tempfile.TemporaryDirectory() as workdir,
            cloud_server.LocalCloudServer.from_traces(workdir=Path(workdir)) as srv,
        ):
            gate = threading.Barrier(clients)

            def client(_):
                gate.wait()
                return one_get(srv.url, srv.token)

            with ThreadPoolExecutor(clients) as pool:
                return list(pool.map(client, range(clients)))
    finally:
        cloud_server._Server.request_queue_size = original


def summary(latencies: list[float | None]) -> str:
    answered = sorted(x for x in latencies if x is not None)
    if not answered:
        return f"answered 0, timed out {len(latencies)}"
    p99 = answered[min(len(answered) - 1, int(0.99 * len(answered)))]
    return (
        f"answered {len(answered)}, timed out {len(latencies) - len(answered)}, "
        f"p50 {statistics.median(answered):.3f} s, p99 {p99:.3f} s, "
        f"max {answered[-1]:.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for backlog in (cloud_server.BACKLOG, 5):
        for number in range(1, args.rounds + 1):
            print(
                f"backlog {backlog:>4}, round {number}: "
                f"{summary(one_round(backlog, args.clients))}",
                flush=True,
            )


if __name__ == "__main__":
    main()
