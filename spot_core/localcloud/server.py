"""The local spot cloud as a service, so leases outlive the process that launched them.

An Airflow worker launches a lease and defers; the triggerer, another process, watches
it; a Prefect worker's `kill_infrastructure` may run elsewhere again. Like a real cloud
API, this server owns the instances and answers any client on 127.0.0.1 over JSON/HTTP:

    GET  /config                     traces, tick origin and time scale (clients rebuild
                                     the identical TraceMarket from it)
    POST /instances                  {"pool", "command", "env", "endpoint_env"} -> view,
                                     or 409 {"error": "capacity_unavailable"}
    POST /instances/describe         {"ids": [...]} -> {id: view}
    POST /instances/<id>/terminate
    GET  /instances/<id>/log?lines=N

Run ``python -m spot_core.localcloud.server --workdir D`` (prints its URL first), or use
``LocalCloudServer`` in-process. Stopping the server terminates every instance.

``--start-on-first-client`` holds the replay at ``--start-tick`` until the first client
asks for the configuration or launches: an engine that takes a variable time to start
(Airflow, Prefect) then meets the trace at the same tick on every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import parse_qs, urlparse

import numpy as np

from spot_core.errors import CapacityUnavailable, ConfigError
from spot_core.localcloud.cloud import LocalCloudConfig, LocalSpotCloud
from spot_core.market.trace import ZoneTrace
from spot_core.market.trace_market import TraceMarket
from spot_core.model import Pool


def trace_to_dict(trace: ZoneTrace) -> dict[str, Any]:
    return {"name": trace.name, "tick_seconds": trace.tick_seconds,
            "available": trace.available.astype(int).tolist(),
            "spot_price": trace.spot_price.tolist(), "on_demand_price": trace.on_demand_price,
            "start_time": trace.start_time, "source": trace.source}


def trace_from_dict(data: dict[str, Any]) -> ZoneTrace:
    return ZoneTrace(name=data["name"], tick_seconds=float(data["tick_seconds"]),
                     available=np.asarray(data["available"], dtype=bool),
                     spot_price=np.asarray(data["spot_price"], dtype=float),
                     on_demand_price=float(data["on_demand_price"]),
                     start_time=data["start_time"], source=data["source"])


class LocalCloudServer:
    """Serves one ``LocalSpotCloud`` on 127.0.0.1."""

    def __init__(self, cloud: LocalSpotCloud, *, port: int = 0,
                 start_on_first_client: bool = False) -> None:
        self.cloud = cloud
        self._port = port
        self._waiting_for_client = start_on_first_client
        self._created_at = cloud.clock()
        self._anchor_lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_traces(cls, traces: Sequence[ZoneTrace] | None = None, *, workdir: str | Path,
                    time_scale: float = 3600.0, start_tick: int = 0,
                    config: LocalCloudConfig | None = None, port: int = 0,
                    start_on_first_client: bool = False) -> LocalCloudServer:
        cloud = LocalSpotCloud.from_traces(traces, time_scale=time_scale, start_tick=start_tick,
                                           workdir=workdir, config=config)
        return cls(cloud, port=port, start_on_first_client=start_on_first_client)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> LocalCloudServer:
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _Handler)
        server.daemon_threads = True
        server.cloud = self.cloud  # type: ignore[attr-defined]
        server.first_client = self.first_client  # type: ignore[attr-defined]
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True,
                                        name=f"local-cloud-{self._port}")
        self._thread.start()
        return self

    def first_client(self) -> None:
        """With ``start_on_first_client``: the replay's clock starts now, at the start tick."""
        with self._anchor_lock:
            if not self._waiting_for_client:
                return
            self._waiting_for_client = False
            self.cloud.market.tick_origin += self.cloud.clock() - self._created_at

    def stop(self) -> None:
        """Stop serving and terminate every instance the cloud started."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.cloud.shutdown()

    def __enter__(self) -> LocalCloudServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config_of(cloud: LocalSpotCloud) -> dict[str, Any]:
    market = cloud.market
    return {"traces": [trace_to_dict(t) for t in market.traces], "tick_origin": market.tick_origin,
            "time_scale": market.time_scale, "workdir": str(cloud.workdir)}


class _Handler(BaseHTTPRequestHandler):
    server_version = "spot-local-cloud/1"

    @property
    def cloud(self) -> LocalSpotCloud:
        return self.server.cloud  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if url.path == "/config":
            self.server.first_client()  # type: ignore[attr-defined]
            return self._send(200, config_of(self.cloud))
        if len(parts) == 3 and parts[0] == "instances" and parts[2] == "log":
            lines = int(parse_qs(url.query).get("lines", ["5"])[0])
            return self._send(200, {"log": self.cloud.log_tail(parts[1], lines)})
        self._send(404, {"error": "not_found", "message": f"no route {url.path}"})

    def do_POST(self) -> None:  # noqa: N802
        parts = urlparse(self.path).path.strip("/").split("/")
        try:
            body = self._body()
            if parts == ["instances"]:
                self.server.first_client()  # type: ignore[attr-defined]
                view = self.cloud.run_instance(Pool.from_dict(body["pool"]), body["command"],
                                               body["env"], body["endpoint_env"])
                return self._send(200, dataclasses.asdict(view))
            if parts == ["instances", "describe"]:
                views = self.cloud.describe(body["ids"])
                return self._send(200, {i: dataclasses.asdict(v) for i, v in views.items()})
            if len(parts) == 3 and parts[0] == "instances" and parts[2] == "terminate":
                self.cloud.terminate_instance(parts[1])
                return self._send(200, {"terminated": parts[1]})
        except CapacityUnavailable as exc:
            return self._send(409, {"error": "capacity_unavailable", "message": str(exc)})
        except (KeyError, TypeError, ValueError) as exc:
            return self._send(400, {"error": "bad_request", "message": str(exc)})
        self._send(404, {"error": "not_found", "message": f"no route {self.path}"})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return  # quiet: the cloud logs what matters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the trace-driven local spot cloud.")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--trace", action="append", type=Path, default=None)
    parser.add_argument("--prices", type=Path, default=None)
    parser.add_argument("--time-scale", type=float, default=3600.0)
    parser.add_argument("--start-tick", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--start-on-first-client", action="store_true",
                        help="hold the replay at --start-tick until the first client connects")
    args = parser.parse_args(argv)
    from spot_core.market.trace import load_traces

    try:
        traces = None if not args.trace else load_traces(args.trace, prices=args.prices)
        server = LocalCloudServer.from_traces(traces, workdir=args.workdir,
                                              time_scale=args.time_scale,
                                              start_tick=args.start_tick, port=args.port,
                                              start_on_first_client=args.start_on_first_client
                                              ).start()
    except ConfigError as exc:
        print(f"cloud_server: error: {exc}", file=sys.stderr)
        return 2
    print(server.url, flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
