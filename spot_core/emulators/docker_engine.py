"""A Docker Engine emulator for the real ``docker`` CLI, where no engine can run.

This machine has the Docker client but no engine (and no way to start one), so image jobs
are tested against this: a small HTTP server speaking the part of the Engine API that
``docker run --rm --init --network host -e NAME -v SRC:DST IMAGE CMD`` uses (ping,
version, info, create, attach with the multiplexed stream, start, wait, kill, remove,
inspect). ``DOCKER_HOST=tcp://127.0.0.1:PORT`` points the CLI at it.

A "container" is a local process running CMD with the environment the CLI sent
(``-e NAME`` values, as the CLI resolved them) on top of this machine's PATH; images are
names from ``images`` (anything else is "No such image" like a registry miss would be,
and pulls are refused). Signals the CLI proxies (``POST /containers/ID/kill``) reach the
process, so a step's emergency save on SIGTERM works as it would in a real container.
What it does not emulate: filesystems and isolation (binds are checked to exist, the
process sees the host), networks other than ``host``, TTYs, stdin. On an instance a
container reaches the instance profile's credentials through IMDSv2 (host network, hop
limit 2); ``instance_profile_env`` stands in for that (e.g. the throwaway credentials the
instance runtime harness gives its instances).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qs, urlparse

API_VERSION = "1.50"


@dataclass
class _Container:
    container_id: str
    image: str
    command: list[str]
    env: dict[str, str]
    auto_remove: bool
    process: subprocess.Popen | None = None
    exit_code: int | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    removed: threading.Event = field(default_factory=threading.Event)
    attached: list[Any] = field(default_factory=list)   # sockets of attached clients
    pumps: list[threading.Thread] = field(default_factory=list)


class FakeDockerEngine:
    """Runs on 127.0.0.1; ``url`` is the value for ``DOCKER_HOST``."""

    def __init__(self, images: Sequence[str],
                 instance_profile_env: Mapping[str, str] | None = None) -> None:
        self.images = set(images)
        self.instance_profile_env = dict(instance_profile_env or {})
        self.containers: dict[str, _Container] = {}
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"tcp://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeDockerEngine:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.engine = self  # type: ignore[attr-defined]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="fake-docker").start()
        return self

    def __exit__(self, *exc: object) -> None:
        for container in list(self.containers.values()):
            if container.process is not None and container.process.poll() is None:
                container.process.kill()
                container.process.wait(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the engine's side of each call ------------------------------------------------------
    def create(self, body: dict[str, Any]) -> _Container:
        image = body.get("Image", "")
        if image not in self.images:
            raise LookupError(f"No such image: {image}")
        host = body.get("HostConfig") or {}
        if host.get("NetworkMode", "default") != "host":
            raise ValueError("this engine runs containers on the host network only")
        for bind in host.get("Binds") or []:
            if not os.path.exists(bind.split(":")[0]):
                raise ValueError(f"invalid mount config: bind source path does not exist: {bind}")
        env = dict(item.split("=", 1) for item in body.get("Env") or [] if "=" in item)
        container = _Container(uuid.uuid4().hex, image, list(body.get("Cmd") or []), env,
                               bool(host.get("AutoRemove")))
        with self._lock:
            self.containers[container.container_id] = container
        return container

    def start(self, container: _Container) -> None:
        env = {"PATH": os.environ.get("PATH", ""), **self.instance_profile_env,
               **container.env}
        container.process = subprocess.Popen(container.command, env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        for stream, pipe in ((1, container.process.stdout), (2, container.process.stderr)):
            pump = threading.Thread(target=self._pump, args=(container, stream, pipe),
                                    daemon=True)
            container.pumps.append(pump)
            pump.start()
        threading.Thread(target=self._reap, args=(container,), daemon=True).start()

    def kill(self, container: _Container, signame: str) -> None:
        signum = int(signame) if signame.isdigit() else getattr(
            signal, signame if signame.startswith("SIG") else f"SIG{signame}")
        if container.process is None or container.process.poll() is not None:
            return
        if signum == signal.SIGKILL:  # PID 1 killed: the whole PID namespace goes with it
            os.killpg(container.process.pid, signum)
        else:  # to PID 1 only (``--init``'s tini hands it to CMD, which is this process)
            os.kill(container.process.pid, signum)

    def _pump(self, container: _Container, stream: int, pipe) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            frame = struct.pack(">BxxxL", stream, len(chunk)) + chunk
            for sock in list(container.attached):
                try:
                    sock.sendall(frame)
                except OSError:
                    container.attached.remove(sock)

    def _reap(self, container: _Container) -> None:
        container.exit_code = container.process.wait()
        container.exited.set()
        if container.auto_remove:
            with self._lock:
                self.containers.pop(container.container_id, None)
            container.removed.set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def engine(self) -> FakeDockerEngine:
        return self.server.engine  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return

    def _route(self) -> tuple[list[str], dict[str, list[str]]]:
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if parts and parts[0].startswith("v1."):
            parts = parts[1:]
        self.engine.calls.append(f"{self.command} /{'/'.join(parts)}")
        return parts, parse_qs(url.query)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route()
        self._send(200, b"", "text/plain")

    def do_GET(self) -> None:  # noqa: N802
        parts, _ = self._route()
        if parts == ["_ping"]:
            return self._send(200, b"OK", "text/plain")
        if parts == ["version"]:
            return self._json(200, {"Version": "fake-28", "ApiVersion": API_VERSION,
                                    "MinAPIVersion": "1.24", "Os": "linux", "Arch": "amd64"})
        if parts == ["info"]:
            return self._json(200, {"ServerVersion": "fake-28", "OSType": "linux",
                                    "Containers": len(self.engine.containers)})
        if len(parts) == 3 and parts[0] == "containers" and parts[2] == "json":
            container = self._container(parts[1])
            if container is None:
                return None
            return self._json(200, {"Id": container.container_id, "Config": {"Tty": False},
                                    "State": {"Running": not container.exited.is_set(),
                                              "ExitCode": container.exit_code or 0}})
        self._json(404, {"message": f"page not found: {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        parts, query = self._route()
        body = self._body()
        if parts == ["containers", "create"]:
            try:
                container = self.engine.create(body)
            except LookupError as exc:
                return self._json(404, {"message": str(exc)})
            except ValueError as exc:
                return self._json(400, {"message": str(exc)})
            return self._json(201, {"Id": container.container_id, "Warnings": []})
        if len(parts) == 3 and parts[0] == "containers":
            container = self._container(parts[1])
            if container is None:
                return None
            action = parts[2]
            if action == "attach":
                return self._attach(container)
            if action == "start":
                self.engine.start(container)
                return self._send(204, b"", None)
            if action == "wait":
                return self._wait(container, query.get("condition", ["not-running"])[0])
            if action == "kill":
                self.engine.kill(container, query.get("signal", ["KILL"])[0])
                return self._send(204, b"", None)
        self._json(404, {"message": f"page not found: {self.path}"})

    def do_DELETE(self) -> None:  # noqa: N802
        parts, _ = self._route()
        if len(parts) == 2 and parts[0] == "containers":
            container = self.engine.containers.pop(parts[1], None)
            if container is not None:
                container.removed.set()
            return self._send(204, b"", None)
        self._json(404, {"message": f"page not found: {self.path}"})

    # -- the streaming calls -------------------------------------------------------------------
    def _attach(self, container: _Container) -> None:
        """Hijack the connection (101) and stream the process's output in Docker frames."""
        self.wfile.write(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: "
                         b"application/vnd.docker.multiplexed-stream\r\nConnection: Upgrade\r\n"
                         b"Upgrade: tcp\r\n\r\n")
        self.wfile.flush()
        container.attached.append(self.connection)
        container.exited.wait()
        for pump in container.pumps:  # everything the process wrote goes out first
            pump.join(timeout=5)
        self.close_connection = True
        try:
            self.connection.shutdown(2)
        except OSError:
            pass

    def _wait(self, container: _Container, condition: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        container.exited.wait()
        if condition == "removed" and container.auto_remove:
            container.removed.wait(timeout=10)
        data = json.dumps({"StatusCode": container.exit_code, "Error": None}).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
        self.wfile.flush()

    # -- plumbing ------------------------------------------------------------------------------
    def _container(self, container_id: str) -> _Container | None:
        found = self.engine.containers.get(container_id) or next(
            (c for c in self.engine.containers.values() if c.container_id.startswith(container_id)),
            None)
        if found is None:
            self._json(404, {"message": f"No such container: {container_id}"})
        return found

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str | None) -> None:
        self.send_response(status)
        self.send_header("Api-Version", API_VERSION)
        self.send_header("Ostype", "linux")
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
