"""The HTTP face of the emulated API server: routing, bearer-token auth, JSON bodies,
chunked streaming for watches and followed logs, discovery, and the emulator's own
control endpoints under ``/emulator/v1`` (reclaim a node, add a pool, taint a node).

HTTP/1.1 with keep-alive, as the clients' connection pools expect: every plain answer
has a Content-Length, every stream is chunked and ends with the zero-length chunk.
"""

from __future__ import annotations

import calendar
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlparse

from .errors import ApiError
from .pools import NodePool
from .resources import GROUPS, RESOURCES, api_group, group_list, resource_list

if TYPE_CHECKING:
    from .store import WatchEvent

Cluster = Any  # a KubeCluster (cluster.py imports this module, so not imported here)

logger = logging.getLogger(__name__)
PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}
VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-spot-emulator",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
MAX_WATCH_SECONDS = 3600.0
BOOKMARK_EVERY = 5.0


class _Server(ThreadingHTTPServer):
    cluster: Cluster  # set by serve before it serves; read by each _Handler


def serve(cluster: Cluster, port: int) -> ThreadingHTTPServer:
    server = _Server(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    server.cluster = cluster
    threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},
        daemon=True,
        name=f"kube-apiserver-{server.server_address[1]}",
    ).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "spot-kube-emulator"
    server: _Server  # the server that made this handler: ours, with its cluster

    @property
    def cluster(self) -> Cluster:
        return self.server.cluster

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # -- dispatch --------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body()
            if path not in PUBLIC and not self._authorized():
                raise ApiError(401, "Unauthorized")
            self._route(method, path, query, body)
        except ApiError as exc:
            self._json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - answer 500 rather than drop the client
            logger.exception("kubernetes emulator failed on %s %s", method, self.path)
            self._json(500, ApiError(500, f"emulator error: {exc}").status())

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.cluster.token.encode()
        )

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        if path in ("/version",):
            return self._json(200, VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return self._send(200, b"ok", "text/plain")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[0] == "emulator":
            return self._admin(method, parts[1:], query, body)
        if parts == ["api"]:
            return self._json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.cluster.url[7:]}
                    ],
                },
            )
        if parts == ["apis"]:
            return self._json(200, group_list())
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in GROUPS:
            return self._json(200, api_group(parts[1]))
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1] in GROUPS and parts[2] == "v1":
            group, rest = parts[1], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        if not rest:
            return self._json(200, resource_list(group, "v1"))
        resource, namespace, name, sub = _resolve(group, rest)
        self._resource(method, resource, namespace, name, sub, query, body)

    def _resource(
        self,
        method: str,
        resource: str,
        namespace: str,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: Any,
    ) -> None:
        api = self.cluster.api
        if name is None:
            if method == "GET" and _flag(query, "watch"):
                return self._watch(resource, namespace, query)
            if method == "GET":
                limit = query.get("limit", "")
                return self._json(
                    200,
                    api.list(
                        resource,
                        namespace or None,
                        query.get("labelSelector"),
                        query.get("fieldSelector"),
                        int(limit) if limit.isdigit() else None,
                        query.get("continue"),
                    ),
                )
            if method == "POST":
                return self._json(201, api.create(resource, namespace, body))
            if method == "DELETE":
                return self._json(
                    200,
                    api.delete_collection(
                        resource,
                        namespace or None,
                        query.get("labelSelector"),
                        query.get("fieldSelector"),
                        _delete_options(query, body),
                    ),
                )
            raise ApiError(405, f"{method} is not supported on a collection here")
        if sub == "log" and resource == "pods" and method == "GET":
            return self._log(namespace, name, query)
        if sub == "eviction" and resource == "pods" and method == "POST":
            return self._json(201, api.evict(namespace, name, body))
        if sub == "binding" and resource == "pods" and method == "POST":
            return self._json(201, api.bind(namespace, name, body))
        if sub not in (None, "status"):
            raise ApiError(
                404, f"the server could not find the requested resource ({resource}/{sub})"
            )
        if method == "GET":
            return self._json(200, api.get(resource, namespace, name))
        if method == "PUT":
            return self._json(200, api.replace(resource, namespace, name, body, sub))
        if method == "PATCH":
            content_type = self.headers.get("Content-Type") or ""
            return self._json(200, api.patch(resource, namespace, name, body, content_type, sub))
        if method == "DELETE":
            return self._json(
                200, api.delete(resource, namespace, name, _delete_options(query, body))
            )
        raise ApiError(405, f"{method} is not supported here")

    # -- streams ---------------------------------------------------------------------------
    def _watch(self, resource: str, namespace: str, query: dict[str, str]) -> None:
        store, api = self.cluster.store, self.cluster.api
        keep = api.matcher(resource, query.get("labelSelector"), query.get("fieldSelector"))
        timeout = min(_number(query, "timeoutSeconds") or MAX_WATCH_SECONDS, MAX_WATCH_SECONDS)
        bookmarks = _flag(query, "allowWatchBookmarks")
        start = query.get("resourceVersion") or "0"
        if not start.isdigit():
            raise ApiError(400, f'invalid resource version: "{start}"')
        self._start_stream("application/json")
        in_scope = (
            (lambda o: o["metadata"].get("namespace") == namespace)
            if namespace
            else (lambda o: True)
        )
        if start == "0":
            items, cursor = store.list(resource, namespace or None)
            for obj in items:
                if keep(obj):
                    self._event("ADDED", obj)
        else:
            cursor = int(start)
        deadline = time.monotonic() + timeout
        last_bookmark = time.monotonic()
        while time.monotonic() < deadline and not self.cluster.stopping.is_set():
            seen = store.resource_version
            try:
                events = store.events_after(cursor, resource)
            except ApiError as exc:
                self._event("ERROR", exc.status())
                break
            for event in events:
                cursor = event.rv
                if not in_scope(event.obj):
                    continue
                kind = _watch_type(event, keep)
                if kind:
                    self._event(kind, event.obj)
            if bookmarks and time.monotonic() - last_bookmark > BOOKMARK_EVERY:
                res = RESOURCES[resource]
                self._event(
                    "BOOKMARK",
                    {
                        "kind": res.kind,
                        "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(cursor)},
                    },
                )
                last_bookmark = time.monotonic()
            if not events:
                store.wait(seen, min(0.5, max(0.0, deadline - time.monotonic())))
        self._end_stream()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def _log(self, namespace: str, name: str, query: dict[str, str]) -> None:
        pod = self.cluster.store.get("pods", namespace, name)
        container = _container_for_log(pod, query.get("container"))
        worker = self.cluster.workers.get(pod["metadata"]["uid"])
        previous = _flag(query, "previous")
        logs = None if worker is None else (worker.previous_logs if previous else worker.logs)
        log = None if logs is None else logs.get(container)
        if log is None:
            if previous:
                raise ApiError(
                    400, f'previous terminated container "{container}" in pod "{name}" not found'
                )
            reason = _waiting_reason(pod, container)
            raise ApiError(
                400, f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        since = None
        if query.get("sinceSeconds"):
            since = time.time() - _number(query, "sinceSeconds")
        elif query.get("sinceTime"):
            since = _rfc3339(query["sinceTime"])
        tail = int(_number(query, "tailLines")) if query.get("tailLines") else None
        timestamps = _flag(query, "timestamps")
        if _flag(query, "follow"):
            self._start_stream("text/plain")
            for data in log.follow(
                self.cluster.stopping, timestamps=timestamps, since=since, tail=tail
            ):
                self._chunk(data)
            self._end_stream()
            return
        limit = int(_number(query, "limitBytes")) if query.get("limitBytes") else None
        self._send(
            200,
            log.read(timestamps=timestamps, since=since, tail=tail, limit_bytes=limit),
            "text/plain",
        )

    # -- the emulator's own endpoints ----------------------------------------------------------
    def _admin(self, method: str, parts: list[str], query: dict[str, str], body: Any) -> None:
        cluster = self.cluster
        if parts == ["v1", "cluster"] and method == "GET":
            return self._json(
                200,
                {
                    "url": cluster.url,
                    "pools": [vars(p) for p in cluster.pools.values()],
                    "nodes": [n["metadata"]["name"] for n in cluster.store.all("nodes")],
                    "reclaims": [r.as_dict() for r in cluster.reclaims],
                },
            )
        if parts == ["v1", "pools"] and method == "POST":
            try:
                nodes = cluster.add_pool(NodePool.from_dict(body or {}))
            except (ValueError, TypeError) as exc:
                raise ApiError(400, str(exc)) from None
            return self._json(201, {"nodes": nodes})
        if len(parts) == 4 and parts[:2] == ["v1", "nodes"] and method == "POST":
            if parts[3] == "reclaim":
                try:
                    reclaim = cluster.reclaim(parts[2], query.get("flavour") or None)
                except ValueError as exc:
                    raise ApiError(400, str(exc)) from None
                if _flag(query, "wait"):
                    reclaim.wait(_number(query, "timeoutSeconds") or 120.0)
                return self._json(202, reclaim.as_dict())
            if parts[3] == "taint":
                from .reclaim import add_taint

                body = body or {}
                if not body.get("key"):
                    raise ApiError(400, "a taint needs a key (and effect, value)")
                add_taint(
                    cluster,
                    parts[2],
                    body["key"],
                    body.get("effect") or "NoSchedule",
                    body.get("value"),
                )
                return self._json(200, cluster.store.get("nodes", "", parts[2]))
        raise ApiError(404, f"no emulator endpoint {method} /emulator/{'/'.join(parts)}")

    # -- plumbing ----------------------------------------------------------------------------
    def _body(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        else:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}") from None

    def _json(self, code: int, payload: Any) -> None:
        self._send(code, json.dumps(payload).encode(), "application/json")

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


def _rfc3339(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        raise ApiError(400, f'sinceTime must be an RFC 3339 time, got "{text}"') from None


def _number(query: dict[str, str], name: str) -> float:
    """A numeric query parameter; 400 naming it when it is not a number."""
    raw = query.get(name, "")
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise ApiError(400, f'{name} must be a number, got "{raw}"') from None


def _flag(query: dict[str, str], name: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (1, t, true, True...)."""
    return query.get(name, "").strip() in ("1", "t", "T", "true", "TRUE", "True")


def _resolve(group: str, rest: list[str]) -> tuple[str, str, str | None, str | None]:
    """Path segments after /api/v1 or /apis/G/V -> (resource, namespace, name, subresource)."""
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
        resource = RESOURCES.get(rest[0])
        if resource is None or not resource.namespaced:
            raise ApiError(404, "the server could not find the requested resource")
    resource = RESOURCES.get(rest[0])
    if resource is None or resource.group != group or len(rest) > 3:
        raise ApiError(404, "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return resource.plural, namespace, name, sub


def _watch_type(event: WatchEvent, keep: Callable[[Mapping[str, Any]], bool]) -> str | None:
    """What a filtered watch reports: an object leaving the selection is DELETED for it,
    one entering it is ADDED, as the API server's filtered watches do."""
    now, before = keep(event.obj), event.old is not None and keep(event.old)
    if event.type == "ADDED":
        return "ADDED" if now else None
    if event.type == "DELETED":
        return "DELETED" if now or before else None
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    return "DELETED" if before else None


def _delete_options(query: dict[str, str], body: Any) -> dict[str, Any]:
    options = dict(body) if isinstance(body, dict) else {}
    if "gracePeriodSeconds" in query:
        options["gracePeriodSeconds"] = int(_number(query, "gracePeriodSeconds"))
    if "propagationPolicy" in query:
        options["propagationPolicy"] = query["propagationPolicy"]
    if query.get("dryRun"):
        options["dryRun"] = [query["dryRun"]]
    policy = options.get("propagationPolicy")
    if policy not in (None, "Orphan", "Background", "Foreground"):
        raise ApiError(
            400, f'propagationPolicy must be Orphan, Background or Foreground, got "{policy}"'
        )
    return options


def _container_for_log(pod: dict[str, Any], container: str | None) -> str:
    names: list[str] = [c["name"] for c in pod["spec"]["containers"]]
    if not container:
        if len(names) == 1:
            return names[0]
        raise ApiError(
            400,
            f"a container name must be specified for pod "
            f"{pod['metadata']['name']}, choose one of: [{' '.join(names)}]",
        )
    if container not in names:
        raise ApiError(400, f"container {container} is not valid for pod {pod['metadata']['name']}")
    return container


def _waiting_reason(pod: dict[str, Any], container: str) -> str:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status["name"] == container:
            waiting = status.get("state", {}).get("waiting") or {}
            reason: str = waiting.get("reason", "ContainerCreating")  # the pod's JSON
            return reason
    return "ContainerCreating"
