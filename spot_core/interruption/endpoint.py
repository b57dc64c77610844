"""Bounded HTTP calls to metadata services, and the log-once-per-outage bookkeeping.

Metadata endpoints live on link-local addresses that a proxy must never see, answer in
milliseconds when healthy, and are exactly what breaks when a node is in trouble. So
every call here bypasses proxies, has a short timeout, reads a bounded body, and turns
every transport failure into ``MetadataEndpointError`` for the detector to absorb.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message

from spot_core.errors import MetadataEndpointError
from spot_core.interruption.base import Notice

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 1.0
MAX_BODY = 64 * 1024
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

Check = Callable[[float], list[Notice]]


class EndpointTimeout(MetadataEndpointError):
    """The endpoint did not answer in time; further calls in the same poll are skipped."""


@dataclass(frozen=True)
class Response:
    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)


def fetch(
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Response:
    """One request; any HTTP status comes back as a Response, transport trouble raises."""
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(request, timeout=timeout) as resp:
            return _response(resp.status, resp.read(MAX_BODY), resp.headers)
    except urllib.error.HTTPError as exc:
        return _response(exc.code, _read_quietly(exc), exc.headers)
    except TimeoutError as exc:
        raise EndpointTimeout(f"{method} {url} timed out after {timeout:g}s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise EndpointTimeout(f"{method} {url} timed out after {timeout:g}s") from exc
        raise MetadataEndpointError(f"{method} {url} failed: {exc.reason}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise MetadataEndpointError(f"{method} {url} failed: {exc!r}") from exc


def _read_quietly(exc: urllib.error.HTTPError) -> bytes:
    """An error body is diagnostics only; failing to read it must not hide the status."""
    try:
        return exc.read(MAX_BODY)
    except (OSError, http.client.HTTPException):
        return b""


def _response(status: int, body: bytes, headers: Message | None) -> Response:
    text = body.decode("utf-8", errors="replace")
    pairs = {k.lower(): v for k, v in headers.items()} if headers is not None else {}
    return Response(status=status, body=text, headers=pairs)


class FailureStreak:
    """Logs the first failure of a streak and the recovery, not every failed poll.

    A watcher polls every second; a metadata endpoint that is down for ten minutes
    must not bury the step's own logs under six hundred identical warnings.
    """

    def __init__(self, source: str, log: logging.Logger = logger) -> None:
        self.source = source
        self.failing = False
        self.failures = 0
        self._log = log

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        if not self.failing:
            self._log.warning(
                "%s: metadata endpoint failing (%s); will log again only after it recovers",
                self.source,
                error,
            )
        else:
            self._log.debug("%s: still failing (%s)", self.source, error)
        self.failing = True

    def succeeded(self) -> None:
        if self.failing:
            self._log.info(
                "%s: metadata endpoint recovered after %d failed polls", self.source, self.failures
            )
        self.failing = False
        self.failures = 0


def bad_answer(source: str, what: str, body: str) -> MetadataEndpointError:
    """The endpoint answered, but not in the shape the cloud documents."""
    snippet = body[:120].replace("\n", " ")
    return MetadataEndpointError(f"{source}: unexpected {what}: {snippet!r}")


def check_status(source: str, resp: Response, ok: tuple[int, ...] = (200,)) -> None:
    if resp.status not in ok:
        raise MetadataEndpointError(f"{source}: HTTP {resp.status}: {resp.body[:120]!r}")


class HttpDetector:
    """Base of the metadata-service detectors: runs their checks, absorbs endpoint trouble.

    Subclasses list their checks (one per metadata path). A timeout ends the poll at
    once, so a hanging endpoint costs one timeout per poll rather than one per path;
    any other failure of one path still lets the others report their notices.
    """

    name = "http"

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self.streak = FailureStreak(f"{self.name} detector at {self.endpoint}")

    def checks(self) -> list[Check]:
        """Callables ``check(now) -> list[Notice]``; each may raise MetadataEndpointError."""
        raise NotImplementedError

    def poll(self, now: float) -> list[Notice]:
        notices: list[Notice] = []
        error: MetadataEndpointError | None = None
        for check in self.checks():
            try:
                notices.extend(check(now))
            except EndpointTimeout as exc:
                error = exc
                break
            except MetadataEndpointError as exc:
                error = error or exc
        if error is None:
            self.streak.succeeded()
        else:
            self.streak.failed(error)
        return notices

    def fetch(self, method: str, path: str, headers: Mapping[str, str]) -> Response:
        return fetch(method, self.endpoint + path, headers, self.timeout)

    def close(self) -> None:
        """Nothing to release; present so every detector can be closed alike."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint!r}, timeout={self.timeout:g})"
