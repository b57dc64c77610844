"""Azure spot eviction notices through Scheduled Events.

The service lists upcoming platform events; a spot eviction is ``EventType: Preempt``
with ``NotBefore`` (an HTTP date, at least 30 s ahead) as the deadline. Other event
types (Freeze, Reboot, Redeploy, Terminate) are maintenance, not spot interruptions,
and are ignored here. Each event has a stable ``EventId``, which is the notice identity.
"""

from __future__ import annotations

import json
from typing import Any

from spot_core.errors import MetadataEndpointError
from spot_core.interruption.base import INTERRUPTION, DetectorPlugin, Notice, parse_rfc1123
from spot_core.interruption.endpoint import (
    DEFAULT_TIMEOUT,
    Check,
    HttpDetector,
    bad_answer,
    check_status,
    fetch,
)

ENDPOINT = "http://169.254.169.254"
API_VERSION = "2020-07-01"
EVENTS_PATH = f"/metadata/scheduledevents?api-version={API_VERSION}"
HEADERS = {"Metadata": "true"}
PREEMPT = "Preempt"


class AzureDetector(HttpDetector):
    """Polls Scheduled Events and reports each ``Preempt`` event once."""

    name = "azure"

    def __init__(self, endpoint: str = ENDPOINT, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(endpoint, timeout)

    def checks(self) -> list[Check]:
        return [self._scheduled_events]

    def _scheduled_events(self, now: float) -> list[Notice]:
        resp = self.fetch("GET", EVENTS_PATH, HEADERS)
        check_status("azure scheduledevents", resp)
        events = _events(resp.body)
        return [
            _notice(event, now, resp.body) for event in events if event.get("EventType") == PREEMPT
        ]


def _events(body: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise bad_answer("azure", "scheduled events (not JSON)", body) from exc
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise bad_answer("azure", "scheduled events shape", body)
    return events


def _notice(event: dict[str, Any], now: float, body: str) -> Notice:
    """``NotBefore`` may be empty once an event has started: then no known deadline."""
    event_id, not_before = event.get("EventId"), event.get("NotBefore")
    if not isinstance(event_id, str) or not event_id:
        raise bad_answer("azure", "EventId", body)
    try:
        deadline = parse_rfc1123(not_before) if not_before else None
    except ValueError as exc:
        raise bad_answer("azure", "NotBefore", body) from exc
    return Notice(INTERRUPTION, "azure", PREEMPT, deadline, now, raw=event, identity=event_id)


def probe(endpoint: str = ENDPOINT, timeout: float = 0.4) -> bool:
    """True when a Scheduled Events service answers with its JSON document."""
    try:
        resp = fetch("GET", endpoint.rstrip("/") + EVENTS_PATH, HEADERS, timeout)
        return resp.status == 200 and isinstance(_events(resp.body), list)
    except MetadataEndpointError:
        return False


PLUGIN = DetectorPlugin(
    make=lambda endpoint, timeout, environ: AzureDetector(endpoint or ENDPOINT, timeout=timeout),
    summary="Azure Scheduled Events: Preempt",
    probe=probe,
    endpoint=ENDPOINT,
    rank=2,
    aliases=(),
)
