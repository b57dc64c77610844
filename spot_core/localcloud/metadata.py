"""A local instance-metadata service speaking the AWS IMDSv2, GCE and Azure shapes.

Tests and the demo need real HTTP against something that behaves like the clouds'
metadata services, including the ways they are unpleasant: IMDSv2's session tokens
(PUT first, 401 without one, 400 for a bad TTL), 404 when nothing is pending, outages,
garbage answers and hangs. Everything is driven from Python (thread-safe) or, as a
subprocess, from the command line:

    python -m spot_core.localcloud.metadata --port 0 --interrupt-after 5

prints its URL on the first line of stdout and serves until SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import logging
import math
import secrets
import selectors
import signal
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
MAX_TTL = 21600
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
FAIL_MODES = ("status", "garbage", "hang")
ACCEPT_TIMEOUT = 0.5  # s: an accept whose client already left gives up after this
GARBAGE = '<html><body>502 Bad Gateway</body></html>{"action": '
AZURE_API_VERSIONS = ("2017-11-01", "2019-01-01", "2019-08-01", "2020-07-01")


@dataclass(frozen=True)
class RequestRecord:
    """One request the emulator answered: for asserting what a client actually sent."""

    method: str
    path: str
    status: int
    headers: dict[str, str]
    at: float


@dataclass(frozen=True)
class _Interruption:
    at: float
    action: str
    deadline: float
    event_id: str


@dataclass
class _Failure:
    mode: str
    status: int
    body: str
    remaining: int | None
    until: float | None
    hang_seconds: float


@dataclass(frozen=True)
class _Reply:
    status: int
    body: str = ""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


def rfc3339_seconds(ts: float) -> str:
    """AWS's ``instance-action`` time format: ``YYYY-MM-DDTHH:MM:SSZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class _Server(ThreadingHTTPServer):
    emulator: MetadataEmulator  # set by MetadataEmulator.start before it serves


def _serve(server: ThreadingHTTPServer, wake: socket.socket) -> None:
    """``serve_forever`` without its polling: it blocks until a connection or ``wake``
    arrives. Why: serve_forever wakes every poll interval to check for a shutdown, and
    the local cloud runs one emulator per lease (1,000 polling at 0.05 s used half a core
    doing nothing, and stopping each waited for its next wake-up)."""
    with selectors.DefaultSelector() as selector:
        selector.register(server, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is wake:
                    return
                server.handle_request()  # bounded by server.timeout if the client left


class MetadataEmulator:
    """An IMDS look-alike on 127.0.0.1; control it with the ``schedule_*`` and ``fail_*``
    methods. Scheduled times are read from ``clock`` so tests can drive time."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: Callable[[], float] = time.time,
        require_token: bool = True,
        clouds: Iterable[str] = CLOUDS,
        instance_id: str = "i-0e1a2b3c4d5e6f708",
        zone: str = "us-east-1a",
        instance_type: str = "m5.xlarge",
    ) -> None:
        unknown = set(clouds) - set(CLOUDS)
        if unknown:
            raise ValueError(f"unknown clouds {sorted(unknown)}: choose from {CLOUDS}")
        self.host, self._port = host, port
        self.clock = clock
        self.require_token = require_token
        self.clouds = frozenset(clouds)
        self.instance_id, self.zone, self.instance_type = instance_id, zone, instance_type
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}
        self._interruption: _Interruption | None = None
        self._rebalance_at: float | None = None
        self._generation = 0
        self._failure: _Failure | None = None
        self._log: list[RequestRecord] = []
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None

    # --- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the emulator has no port yet: start() it first")
        return f"http://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> MetadataEmulator:
        """Serve on the port given (ephemeral if 0); a restart reuses the same port."""
        if self._server is not None:
            return self
        self._release.clear()
        server = _Server((self.host, self._port), _Handler)
        server.daemon_threads = True
        server.emulator = self
        server.timeout = ACCEPT_TIMEOUT
        self._port = server.server_address[1]
        self._server = server
        self._wake = socket.socketpair()
        self._thread = threading.Thread(
            target=_serve,
            args=(server, self._wake[0]),
            name=f"metadata-emulator-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; hanging requests are released. Connections are refused after."""
        server, self._server = self._server, None
        if server is None:
            return
        self._release.set()
        wake, self._wake = self._wake, None
        if wake is None:  # start() makes it with the server; as indexing None did
            raise TypeError("the emulator's wake-up sockets are missing")
        wake[1].send(b"x")  # the serving thread returns at once
        if self._thread is not None:
            self._thread.join(timeout)
        server.server_close()
        for end in wake:
            end.close()

    def __enter__(self) -> MetadataEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- control ---------------------------------------------------------------------

    def schedule_interruption(
        self, at: float | None = None, action: str = "terminate", notice_seconds: float = 120.0
    ) -> float:
        """Serve a notice from ``at`` (default now) on; return its deadline.

        The deadline (AWS ``time``, Azure ``NotBefore``) is ``at + notice_seconds``
        rounded up to a whole second, since both formats carry whole seconds.
        """
        if action not in ("terminate", "stop", "hibernate"):
            raise ValueError(f"action must be terminate, stop or hibernate, got {action!r}")
        with self._lock:
            start = self.clock() if at is None else at
            deadline = float(math.ceil(start + notice_seconds))
            self._interruption = _Interruption(start, action, deadline, str(uuid.uuid4()))
            self._generation += 1
            return deadline

    def schedule_rebalance(self, at: float | None = None) -> None:
        """Serve an EC2 rebalance recommendation from ``at`` (default now) on."""
        with self._lock:
            self._rebalance_at = self.clock() if at is None else at
            self._generation += 1

    def clear(self) -> None:
        """Withdraw pending notices (a new attempt on fresh capacity)."""
        with self._lock:
            self._interruption = None
            self._rebalance_at = None
            self._generation += 1

    def expire_tokens(self) -> None:
        """Invalidate every IMDSv2 token issued so far: the next GET with one gets 401."""
        with self._lock:
            self._tokens.clear()

    def fail_requests(
        self,
        status: int = 500,
        *,
        mode: str = "status",
        count: int | None = None,
        duration: float | None = None,
        body: str | None = None,
        hang_seconds: float = 10.0,
    ) -> None:
        """Misbehave on the next ``count`` requests / for ``duration`` s / until recover().

        ``mode``: ``status`` answers ``status``; ``garbage`` answers 200 with ``body``
        (default: truncated HTML+JSON); ``hang`` holds each request ``hang_seconds``
        (released early by stop()) and then answers normally.
        """
        if mode not in FAIL_MODES:
            raise ValueError(f"mode must be one of {FAIL_MODES}, got {mode!r}")
        with self._lock:
            until = None if duration is None else self.clock() + duration
            self._failure = _Failure(
                mode, status, GARBAGE if body is None else body, count, until, hang_seconds
            )

    def recover(self) -> None:
        """End any failure mode set by fail_requests()."""
        with self._lock:
            self._failure = None

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # --- serving (called from handler threads) ---------------------------------------

    def _take_failure(self) -> _Failure | None:
        with self._lock:
            failure = self._failure
            if failure is None:
                return None
            if failure.until is not None and self.clock() >= failure.until:
                self._failure = None
                return None
            if failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failure = None
            return failure

    def _record(self, method: str, path: str, status: int, headers: dict[str, str]) -> None:
        with self._lock:
            self._log.append(RequestRecord(method, path, status, headers, self.clock()))

    def answer(self, method: str, target: str, headers: dict[str, str]) -> _Reply:
        """The reply to one request, after any failure mode has had its say."""
        failure = self._take_failure()
        if failure is not None and failure.mode == "hang":
            self._release.wait(failure.hang_seconds)
        elif failure is not None:
            return _failure_reply(failure)
        parts = urllib.parse.urlsplit(target)
        path, query = parts.path, urllib.parse.parse_qs(parts.query)
        if path.startswith("/latest/") and "aws" in self.clouds:
            return self._aws(method, path, headers)
        if path.startswith("/computeMetadata/") and "gcp" in self.clouds:
            return self._gce(method, path, headers)
        if path.startswith("/metadata/") and "azure" in self.clouds:
            return self._azure(method, path, query, headers)
        return _Reply(404, "Not Found")

    # --- AWS IMDSv2 --------------------------------------------------------------------

    def _aws(self, method: str, path: str, headers: dict[str, str]) -> _Reply:
        if path == "/latest/api/token":
            return self._aws_token(headers) if method == "PUT" else _Reply(405, "")
        if method != "GET":
            return _Reply(405, "")
        denied = self._aws_auth(headers.get(TOKEN_HEADER.lower()))
        if denied is not None:
            return denied
        body = self._aws_metadata(path)
        return _Reply(404, _not_found_html()) if body is None else _Reply(200, body)

    def _aws_token(self, headers: dict[str, str]) -> _Reply:
        """AWS refuses tokens to forwarded requests (403) and needs a TTL of 1..21600."""
        if "x-forwarded-for" in headers:
            return _Reply(403, "")
        try:
            ttl = int(headers.get(TTL_HEADER.lower(), ""))
        except ValueError:
            return _Reply(400, "")
        if not 1 <= ttl <= MAX_TTL:
            return _Reply(400, "")
        token = secrets.token_urlsafe(42)
        with self._lock:
            self._tokens[token] = self.clock() + ttl
        return _Reply(200, token, headers=((TTL_HEADER, str(ttl)),))

    def _aws_auth(self, token: str | None) -> _Reply | None:
        """401 for a missing (when required), unknown or expired token; None to go on."""
        if token is None:
            return _Reply(401, "") if self.require_token else None
        with self._lock:
            expires = self._tokens.get(token)
            valid = expires is not None and self.clock() < expires
        return None if valid else _Reply(401, "")

    def _aws_metadata(self, path: str) -> str | None:
        now = self.clock()
        with self._lock:
            notice, rebalance_at = self._interruption, self._rebalance_at
        pending = notice if notice is not None and now >= notice.at else None
        fixed = {
            "/latest/meta-data/": "ami-id\nevents/\ninstance-id\ninstance-type\nplacement/\nspot/",
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": self.instance_type,
            "/latest/meta-data/placement/availability-zone": self.zone,
            "/latest/meta-data/placement/region": self.zone.rstrip("abcdefghijklmnopqrstuvwxyz"),
        }
        if path in fixed:
            return fixed[path]
        if path == "/latest/meta-data/spot/instance-action" and pending:
            return json.dumps({"action": pending.action, "time": rfc3339_seconds(pending.deadline)})
        if (
            path == "/latest/meta-data/spot/termination-time"
            and pending
            and pending.action == "terminate"
        ):
            return rfc3339_seconds(pending.deadline)
        if (
            path == "/latest/meta-data/events/recommendations/rebalance"
            and rebalance_at is not None
            and now >= rebalance_at
        ):
            return json.dumps({"noticeTime": rfc3339_seconds(rebalance_at)})
        return None

    # --- GCE -----------------------------------------------------------------------------

    def _gce(self, method: str, path: str, headers: dict[str, str]) -> _Reply:
        """The GCE server refuses requests without ``Metadata-Flavor: Google`` (403)."""
        flavor = (("Metadata-Flavor", "Google"),)
        if headers.get("metadata-flavor") != "Google":
            return _Reply(403, "Missing Metadata-Flavor:Google header.", headers=flavor)
        if method != "GET":
            return _Reply(405, "", headers=flavor)
        values = {
            "/computeMetadata/v1/instance/preempted": self._gce_preempted(),
            "/computeMetadata/v1/instance/id": "4520031799277581759",
            "/computeMetadata/v1/instance/zone": "projects/1/zones/us-central1-a",
        }
        if path not in values:
            return _Reply(404, "Not Found", headers=flavor)
        return _Reply(200, values[path], content_type="application/text", headers=flavor)

    def _gce_preempted(self) -> str:
        with self._lock:
            notice = self._interruption
        return "TRUE" if notice is not None and self.clock() >= notice.at else "FALSE"

    # --- Azure Scheduled Events ---------------------------------------------------------

    def _azure(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> _Reply:
        if headers.get("metadata", "").lower() != "true":
            return _azure_error("Bad request. Required metadata header not specified")
        if query.get("api-version", [""])[0] not in AZURE_API_VERSIONS:
            return _azure_error("Bad request. api-version is missing or not supported")
        if path.rstrip("/") != "/metadata/scheduledevents":
            return _Reply(404, json.dumps({"error": "Not found"}), "application/json")
        if method == "POST":
            return _Reply(200, "", "application/json")
        return _Reply(200, json.dumps(self._azure_document()), "application/json")

    def _azure_document(self) -> dict[str, Any]:
        with self._lock:
            notice, generation = self._interruption, self._generation
        events = []
        if notice is not None and self.clock() >= notice.at:
            events.append(
                {
                    "EventId": notice.event_id,
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [self.instance_id],
                    "EventStatus": "Scheduled",
                    "NotBefore": email.utils.formatdate(notice.deadline, usegmt=True),
                    "Description": "Spot eviction",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
        return {"DocumentIncarnation": generation, "Events": events}


def _failure_reply(failure: _Failure) -> _Reply:
    if failure.mode == "garbage":
        return _Reply(200, failure.body)
    return _Reply(failure.status, f"emulated failure {failure.status}")


def _azure_error(message: str) -> _Reply:
    return _Reply(400, json.dumps({"error": message}), "application/json")


def _not_found_html() -> str:
    return (
        '<?xml version="1.0" encoding="iso-8859-1"?>\n<html><head><title>404 - '
        "Not Found</title></head><body><h1>404 - Not Found</h1></body></html>"
    )


class _Handler(BaseHTTPRequestHandler):
    """Hands every request to the emulator; all behaviour lives there."""

    server_version = "EC2ws"
    sys_version = ""
    server: _Server  # the server that made this handler: ours, with its emulator

    def _serve(self) -> None:
        emulator = self.server.emulator
        headers = {k.lower(): v for k, v in self.headers.items()}
        length = int(headers.get("content-length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        reply = emulator.answer(self.command, self.path, headers)
        emulator._record(self.command, self.path, reply.status, headers)
        try:
            self._send(reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout) while the request hung

    def _send(self, reply: _Reply) -> None:
        data = reply.body.encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)


# --- command line ------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spot_core.localcloud.metadata",
        description="Serve AWS IMDSv2 / GCE / Azure metadata shapes on 127.0.0.1.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument(
        "--interrupt-after",
        type=float,
        metavar="S",
        help="serve an interruption notice S seconds after start",
    )
    parser.add_argument("--action", default="terminate", choices=["terminate", "stop", "hibernate"])
    parser.add_argument("--notice-seconds", type=float, default=120.0)
    parser.add_argument("--rebalance-after", type=float, metavar="S")
    parser.add_argument(
        "--no-require-token",
        action="store_true",
        help="also answer IMDSv1 requests without a token",
    )
    parser.add_argument(
        "--exit-after",
        type=float,
        default=3600.0,
        metavar="S",
        help="stop serving after S seconds (default 3600), a safety net",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the URL, serve until SIGTERM/SIGINT or ``--exit-after``; exit 0."""
    args = _parse(argv)
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    emulator = MetadataEmulator(args.host, args.port, require_token=not args.no_require_token)
    with emulator:
        now = emulator.clock()
        if args.interrupt_after is not None:
            emulator.schedule_interruption(
                now + args.interrupt_after, args.action, args.notice_seconds
            )
        if args.rebalance_after is not None:
            emulator.schedule_rebalance(now + args.rebalance_after)
        print(emulator.url, flush=True)
        give_up = time.monotonic() + args.exit_after
        while not stop["now"] and time.monotonic() < give_up:
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
