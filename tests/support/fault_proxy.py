"""A real HTTP proxy that can fail on purpose: 503 answers, reset connections or slow ones.

It stands between a client library and a real server (the local cloud server, moto), so
the client meets the same transient failures a cloud API gives: the code under test is
unmodified, and so is the server. For S3 it also breaks answers the way a network does
after the server did its part: a body cut short under its full Content-Length, an answer
that never comes, a request carried out whose answer is lost. It also counts what it
forwards (``forwarded``: per EC2 query ``Action``, else per method and path), i.e. the
requests the server answered.
"""

from __future__ import annotations

import collections
import http.client
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

AFTER_FORWARDING = ("cut", "stall", "drop")


class FaultProxy:
    """Forwards to ``upstream``; requests whose request line or body contains ``match``
    (e.g. ``/describe``, ``POST /instances ``, or ``Action=DescribeInstances`` for EC2's
    query API), and whose method is in ``methods`` (all when None), fail while ``mode`` is
    ``"503"`` (Service Unavailable), ``"reset"`` (TCP reset, no answer) or ``"capacity"``
    (the local cloud server's own 409 no-capacity answer), or are held ``delay`` seconds
    before they are forwarded while ``mode`` is ``"slow"``. After forwarding: ``"cut"``
    sends the headers (the true Content-Length) and half the body, then closes;
    ``"stall"`` holds the answer ``delay`` seconds, then closes without it; ``"drop"``
    resets the connection instead of answering (the server has acted on the request).
    ``times``: how many requests fail before the proxy forwards faithfully again (None:
    every matching one)."""

    def __init__(
        self,
        upstream: str,
        match: str = "",
        methods: tuple[str, ...] | None = None,
        delay: float = 0.5,
        times: int | None = None,
    ) -> None:
        self.upstream = urlsplit(upstream)
        self.match = match
        self.methods = methods
        self.delay = delay
        self.times = times
        self.mode: str | None = None
        self.failed = 0
        self.forwarded: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 answers a client's "Expect: 100-continue" (boto3's PUTs) at once,
            # instead of leaving it to wait a second for a go-ahead before every upload.
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = proxy.mode
                if not (proxy.methods is None or self.command in proxy.methods) or not (
                    proxy.match in self.requestline or proxy.match.encode() in body
                ):
                    mode = None
                with proxy._lock:
                    if mode and proxy.times is not None and proxy.failed >= proxy.times:
                        mode = None
                    if mode:
                        proxy.failed += 1
                if mode == "slow":
                    time.sleep(proxy.delay)
                elif mode and mode not in AFTER_FORWARDING:
                    if mode == "reset":
                        self.connection.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        self.close_connection = True
                        return
                    if mode == "capacity":
                        data = (
                            b'{"error": "capacity_unavailable", "message": '
                            b'"InsufficientInstanceCapacity (injected)"}'
                        )
                        self.send_response(409)
                        self.send_header("Content-Type", "application/json")
                    else:
                        data = b""
                        self.send_response(503)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                proxy._count(self.command, self.path, body)
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=30
                )
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")
                }
                conn.request(self.command, self.path, body=body or None, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                if mode in AFTER_FORWARDING:
                    self._break_answer(mode, answer, data)
                    return
                self.send_response(answer.status)
                # A HEAD answer has no body but tells the length of the object (S3's size check).
                length = (
                    answer.getheader("Content-Length", "0")
                    if self.command == "HEAD"
                    else str(len(data))
                )
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _break_answer(self, mode: str, answer, data: bytes) -> None:
                self.close_connection = True
                if mode == "stall":
                    time.sleep(proxy.delay)
                    return
                if mode == "drop":
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    return
                self.send_response(answer.status)  # "cut": the whole length declared
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _count(self, method: str, path: str, body: bytes) -> None:
        action = parse_qs(body.decode(errors="replace")).get("Action") if body else None
        with self._lock:
            self.forwarded[action[0] if action else f"{method} {path.split('?')[0]}"] += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
