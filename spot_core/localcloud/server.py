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
    GET  /stats                      requests served per route, and how often each
                                     instance was described (what benchmarks count)

Run ``python -m spot_core.localcloud.server --workdir D`` (prints its URL first), or use
``LocalCloudServer`` in-process. Stopping the server terminates every instance.

It runs commands, so it answers only its owner: at start it draws a random token (32
bytes) and writes it to ``D/server.token``, readable by its owner alone (mode 0600).
Every request must carry ``Authorization: Bearer TOKEN`` (else 401), and every POST a
``Content-Type: application/json`` body (else 415), so a web page's cross-origin
"simple" POST (text/plain, no custom header) cannot launch anything. Clients find the
token in ``$SPOT_LOCAL_CLOUD_TOKEN`` or in the server's workdir (``client_environ``).

Every request gets a JSON answer, never a dropped connection or a traceback: a body that
is not a JSON object (malformed, nested past ``MAX_JSON_DEPTH``, NaN), a field of the
wrong type, an empty command or one that cannot be run, ``?lines=abc``: 400; a body
declared longer than ``MAX_BODY_BYTES``: 413 (unread); anything unforeseen: 500. A
listen backlog of ``BACKLOG`` and a thread per connection (each bounded by
``REQUEST_TIMEOUT_SECONDS`` of silence) answer hundreds of clients at once (bench/README.md).

``--start-on-first-client`` holds the replay at ``--start-tick`` until the first client
asks for the configuration or launches: an engine that takes a variable time to start
(Airflow, Prefect) then meets the trace at the same tick on every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

from spot_core.errors import CapacityUnavailable, ConfigError
from spot_core.localcloud.cloud import LocalCloudConfig, LocalSpotCloud
from spot_core.market.trace import ZoneTrace
from spot_core.model import Pool

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
BACKLOG = 1024  # pending connections the kernel holds (socketserver's 5 dropped
# 25 of 200 concurrent clients); Linux caps it at somaxconn
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a launch or a describe of 10,000 ids is far smaller
MAX_JSON_DEPTH = 32  # the API's bodies nest 3 deep
MAX_LOG_LINES = 10_000
MAX_IDS = 10_000
REQUEST_TIMEOUT_SECONDS = 10.0  # a silent client frees its thread after this
TOKEN_FILE = "server.token"
TOKEN_ENV = "SPOT_LOCAL_CLOUD_TOKEN"
URL_ENV = "SPOT_LOCAL_CLOUD_URL"


def token_path(workdir: str | Path) -> Path:
    return Path(workdir) / TOKEN_FILE


def read_token(workdir: str | Path) -> str:
    """The token a server running in ``workdir`` wrote (ConfigError naming the fix)."""
    path = token_path(workdir)
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the local cloud token {path} ({exc}); give the "
            f"workdir of a running server, or set ${TOKEN_ENV}"
        ) from None


def client_environ(url: str, workdir: str | Path) -> dict[str, str]:
    """What a process (an Airflow triggerer, a Prefect worker) needs in its environment to
    open ``open_provider("local")`` on this server: its URL and its token."""
    return {URL_ENV: url, TOKEN_ENV: read_token(workdir)}


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only (0600 from creation, never wider),
    replacing any older file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(text)
    os.replace(scratch, path)


def trace_to_dict(trace: ZoneTrace) -> dict[str, Any]:
    return {
        "name": trace.name,
        "tick_seconds": trace.tick_seconds,
        "available": trace.available.astype(int).tolist(),
        "spot_price": trace.spot_price.tolist(),
        "on_demand_price": trace.on_demand_price,
        "start_time": trace.start_time,
        "source": trace.source,
    }


def trace_from_dict(data: dict[str, Any]) -> ZoneTrace:
    return ZoneTrace(
        name=data["name"],
        tick_seconds=float(data["tick_seconds"]),
        available=np.asarray(data["available"], dtype=bool),
        spot_price=np.asarray(data["spot_price"], dtype=float),
        on_demand_price=float(data["on_demand_price"]),
        start_time=data["start_time"],
        source=data["source"],
    )


class RequestStats:
    """What the server answered: requests per route (``"POST /instances/describe"``) and
    describes per instance id, counted where a cloud counts them, at the API."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.described: dict[str, int] = {}

    def count(self, route: str, described: Sequence[str] = ()) -> None:
        with self._lock:
            self.requests[route] = self.requests.get(route, 0) + 1
            for instance_id in described:
                self.described[instance_id] = self.described.get(instance_id, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": dict(self.requests), "described": dict(self.described)}


class LocalCloudServer:
    """Serves one ``LocalSpotCloud`` on 127.0.0.1, or on ``host`` (a container's
    ``0.0.0.0``, so that the stack's other containers reach it; the token still guards it)."""

    def __init__(
        self,
        cloud: LocalSpotCloud,
        *,
        port: int = 0,
        host: str = LOOPBACK,
        start_on_first_client: bool = False,
    ) -> None:
        self.cloud = cloud
        self._host = host
        self._port = port
        self._waiting_for_client = start_on_first_client
        self._created_at = cloud.clock()
        self._anchor_lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.token = secrets.token_urlsafe(32)  # 32 random bytes; printed nowhere
        self.stats = RequestStats()

    @property
    def token_file(self) -> Path:
        return token_path(self.cloud.workdir)

    @classmethod
    def from_traces(
        cls,
        traces: Sequence[ZoneTrace] | None = None,
        *,
        workdir: str | Path,
        time_scale: float = 3600.0,
        start_tick: int = 0,
        config: LocalCloudConfig | None = None,
        port: int = 0,
        host: str = LOOPBACK,
        start_on_first_client: bool = False,
    ) -> LocalCloudServer:
        cloud = LocalSpotCloud.from_traces(
            traces, time_scale=time_scale, start_tick=start_tick, workdir=workdir, config=config
        )
        return cls(cloud, port=port, host=host, start_on_first_client=start_on_first_client)

    @property
    def url(self) -> str:
        """Where this machine reaches it (the loopback address when bound to all)."""
        host = LOOPBACK if self._host in ("0.0.0.0", "") else self._host
        return f"http://{host}:{self._port}"

    def start(self) -> LocalCloudServer:
        _write_private(self.token_file, self.token)  # before the first request can come
        server = _Server((self._host, self._port), _Handler)
        server.cloud = self.cloud
        server.token = self.token
        server.first_client = self.first_client
        server.stats = self.stats
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, daemon=True, name=f"local-cloud-{self._port}"
        )
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
            self._forget_token()
        self.cloud.shutdown()

    def _forget_token(self) -> None:
        """Remove the token file if it is still ours (a newer server may own the workdir)."""
        try:
            if self.token_file.read_text(encoding="ascii").strip() == self.token:
                self.token_file.unlink()
        except (OSError, UnicodeDecodeError):
            pass

    def __enter__(self) -> LocalCloudServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config_of(cloud: LocalSpotCloud) -> dict[str, Any]:
    market = cloud.market
    return {
        "traces": [trace_to_dict(t) for t in market.traces],
        "tick_origin": market.tick_origin,
        "time_scale": market.time_scale,
        "workdir": str(cloud.workdir),
    }


class BadRequest(Exception):
    """What the client sent is wrong: answered ``status`` with ``message``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _Server(ThreadingHTTPServer):
    """A thread per connection (daemon: never holds the process), a deep backlog, and
    no traceback on stderr for a connection that breaks (a client that went away)."""

    daemon_threads = True
    request_queue_size = BACKLOG
    # Set by LocalCloudServer.start before it serves; read by each _Handler.
    cloud: LocalSpotCloud
    token: str
    first_client: Callable[[], None]
    stats: RequestStats

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        log.debug("local cloud: connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server_version = "spot-local-cloud/1"
    timeout = REQUEST_TIMEOUT_SECONDS  # socketserver sets it on the connection
    # http.server's own refusals (a malformed request line, headers past its limits) in
    # JSON too; its fields come HTML-escaped, which keeps them valid JSON strings.
    error_content_type = "application/json"
    error_message_format = '{"error": "http_%(code)d", "message": "%(message)s: %(explain)s"}'
    server: _Server  # the server that made this handler: ours, with its cloud and token

    @property
    def cloud(self) -> LocalSpotCloud:
        return self.server.cloud

    def _authorized(self) -> bool:
        """The bearer token, compared in constant time; else a 401 is sent."""
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        expected = self.server.token
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), expected.encode()
        ):
            return True
        self._send(
            401,
            {
                "error": "unauthorized",
                "message": "send the server's token as "
                f"'Authorization: Bearer TOKEN' (it is in the server's workdir, "
                f"{TOKEN_FILE})",
            },
            extra={"WWW-Authenticate": "Bearer"},
        )
        return False

    def _json_body_declared(self) -> bool:
        """Only ``application/json`` bodies: a browser cannot send that cross-origin
        without a preflight this server never grants. Else a 415 is sent."""
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind == "application/json":
            return True
        self._send(
            415,
            {
                "error": "unsupported_media_type",
                "message": "POST bodies must be "
                f"Content-Type: application/json (got {kind or 'none'!r})",
            },
        )
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post)

    def _answer(self, route: Callable[[], None]) -> None:
        """Run ``route``; whatever goes wrong, the client gets one JSON answer."""
        try:
            route()
        except BadRequest as exc:
            self._send(
                exc.status,
                {
                    "error": "bad_request" if exc.status == 400 else "payload_too_large",
                    "message": str(exc)[:500],
                },
            )
        except CapacityUnavailable as exc:
            self._send(409, {"error": "capacity_unavailable", "message": str(exc)})
        except ConfigError as exc:  # the cloud's own check of what was asked (a zone)
            self._send(400, {"error": "bad_request", "message": str(exc)[:500]})
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away or fell silent
        except Exception as exc:  # noqa: BLE001 - an answer, never a dropped connection
            log.warning(
                "local cloud: %s %s failed: %s: %s",
                self.command,
                self.path,
                type(exc).__name__,
                exc,
            )
            self._send(500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"[:500]})

    def _get(self) -> None:
        if not self._authorized():
            return
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if url.path == "/config":
            self._count("GET /config")
            self.server.first_client()
            return self._send(200, config_of(self.cloud))
        if url.path == "/stats":
            return self._send(200, self.server.stats.to_dict())
        if len(parts) == 3 and parts[0] == "instances" and parts[2] == "log":
            self._count("GET /instances/<id>/log")
            lines = _lines(parse_qs(url.query).get("lines", ["5"])[0])
            return self._send(200, {"log": self.cloud.log_tail(parts[1], lines)})
        self._send(404, {"error": "not_found", "message": f"no route {url.path}"})

    def _post(self) -> None:
        if not self._authorized() or not self._json_body_declared():
            return
        parts = urlparse(self.path).path.strip("/").split("/")
        body = self._body()
        if parts == ["instances"]:
            self._count("POST /instances")
            pool, command, env, endpoint_env = _launch_request(body)
            self.server.first_client()
            try:
                view = self.cloud.run_instance(pool, command, env, endpoint_env)
            except OSError as exc:  # no such binary, not executable: the client's to fix
                raise BadRequest(
                    f"cannot run command {command[0]!r}: {exc.strerror or exc}"
                ) from None
            return self._send(200, dataclasses.asdict(view))
        if parts == ["instances", "describe"]:
            ids = _ids(body)
            self._count("POST /instances/describe", ids)
            views = self.cloud.describe(ids)
            return self._send(200, {i: dataclasses.asdict(v) for i, v in views.items()})
        if len(parts) == 3 and parts[0] == "instances" and parts[2] == "terminate":
            self._count("POST /instances/<id>/terminate")
            self.cloud.terminate_instance(parts[1])
            return self._send(200, {"terminated": parts[1]})
        self._send(404, {"error": "not_found", "message": f"no route {self.path}"})

    def _count(self, route: str, described: Sequence[str] = ()) -> None:
        self.server.stats.count(route, described)

    def _body(self) -> dict[str, Any]:
        """The request's JSON object, read only when it is declared no larger than
        ``MAX_BODY_BYTES`` (a larger one is refused unread: 413)."""
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not declared.isdigit():
            self.close_connection = True
            raise BadRequest(f"Content-Length {declared[:40]!r} is not a byte count")
        length = int(declared)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # its body is never read: do not parse it as a request
            raise BadRequest(
                f"the body is {length} bytes; at most {MAX_BODY_BYTES} are accepted", status=413
            )
        data = self.rfile.read(length)
        if len(data) < length:
            raise ConnectionError("the client sent less than its Content-Length")
        return parse_body(data or b"{}")

    def _send(
        self, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return  # quiet: the cloud logs what matters


def parse_body(data: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or ``BadRequest`` (not JSON, NaN or Infinity,
    nested deeper than ``MAX_JSON_DEPTH``, not an object)."""
    if _depth(data) > MAX_JSON_DEPTH:
        raise BadRequest(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
    return body


def _depth(data: bytes) -> int:
    """How deep brackets nest in ``data`` (strings skipped), before parsing: deep nesting
    would cost the parser its recursion limit."""
    depth = deepest = 0
    for token in re.finditer(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', data):
        mark = token.group()
        if mark in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif mark in (b"]", b"}"):
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _launch_request(body: dict[str, Any]) -> tuple[Pool, list[str], dict[str, str], str]:
    """``POST /instances``'s fields, each of its type (else ``BadRequest`` naming it)."""
    missing = [k for k in ("pool", "command", "env", "endpoint_env") if k not in body]
    if missing:
        raise BadRequest(f"missing field(s) {', '.join(missing)}")
    pool, command, env, endpoint_env = (body[k] for k in ("pool", "command", "env", "endpoint_env"))
    if not isinstance(pool, dict):
        raise BadRequest("pool must be an object (cloud, region, zone, instance_type, market)")
    try:
        pool = Pool.from_dict(pool)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"pool is not a pool: {type(exc).__name__}: {exc}") from None
    if not (
        isinstance(command, list)
        and command
        and all(isinstance(w, str) and "\0" not in w for w in command)
        and command[0]
    ):
        raise BadRequest('command must be a non-empty list of strings, e.g. ["python", "train.py"]')
    if not (
        isinstance(env, dict)
        and all(
            isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in env.items()
        )
    ):
        raise BadRequest("env must be an object of variable names to strings")
    if not (isinstance(endpoint_env, str) and _ENV_NAME.fullmatch(endpoint_env)):
        raise BadRequest("endpoint_env must be an environment variable name")
    return pool, command, env, endpoint_env


def _ids(body: dict[str, Any]) -> list[str]:
    ids = body.get("ids")
    if not (isinstance(ids, list) and len(ids) <= MAX_IDS and all(isinstance(i, str) for i in ids)):
        raise BadRequest(f"ids must be a list of at most {MAX_IDS} instance ids (strings)")
    return ids


def _lines(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) <= MAX_LOG_LINES):
        raise BadRequest(f"lines={text[:20]!r} must be a whole number from 0 to {MAX_LOG_LINES}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the trace-driven local spot cloud.")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--trace", action="append", type=Path, default=None)
    parser.add_argument("--prices", type=Path, default=None)
    parser.add_argument("--time-scale", type=float, default=3600.0)
    parser.add_argument("--start-tick", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--host",
        default=LOOPBACK,
        help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    parser.add_argument(
        "--start-on-first-client",
        action="store_true",
        help="hold the replay at --start-tick until the first client connects",
    )
    args = parser.parse_args(argv)
    from spot_core.market.trace import load_traces

    try:
        traces = None if not args.trace else load_traces(args.trace, prices=args.prices)
        server = LocalCloudServer.from_traces(
            traces,
            workdir=args.workdir,
            time_scale=args.time_scale,
            start_tick=args.start_tick,
            port=args.port,
            host=args.host,
            start_on_first_client=args.start_on_first_client,
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
