"""GCE preemption (spot VM) notices through the metadata server.

``instance/preempted`` flips from ``FALSE`` to ``TRUE`` when the VM is being
preempted; Google gives about 30 seconds from then until the VM stops, and the
metadata server says nothing about the exact time, so the deadline is detection + 30 s.
"""

from __future__ import annotations

from spot_core.errors import MetadataEndpointError
from spot_core.interruption.base import INTERRUPTION, DetectorPlugin, Notice
from spot_core.interruption.endpoint import (
    DEFAULT_TIMEOUT,
    Check,
    HttpDetector,
    bad_answer,
    check_status,
    fetch,
)

ENDPOINT = "http://metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
FLAVOR = {"Metadata-Flavor": "Google"}
NOTICE_SECONDS = 30.0


class GceDetector(HttpDetector):
    """Polls ``instance/preempted``; one preemption per VM life, so one identity."""

    name = "gcp"

    def __init__(
        self,
        endpoint: str = ENDPOINT,
        timeout: float = DEFAULT_TIMEOUT,
        notice_seconds: float = NOTICE_SECONDS,
    ) -> None:
        super().__init__(endpoint, timeout)
        self.notice_seconds = notice_seconds

    def checks(self) -> list[Check]:
        return [self._preempted]

    def _preempted(self, now: float) -> list[Notice]:
        resp = self.fetch("GET", PREEMPTED_PATH, FLAVOR)
        check_status("gcp preempted", resp)
        value = resp.body.strip().upper()
        if value == "FALSE":
            return []
        if value != "TRUE":
            raise bad_answer("gcp", "preempted value", resp.body)
        return [
            Notice(
                INTERRUPTION,
                "gcp",
                "terminate",
                now + self.notice_seconds,
                now,
                raw=resp.body,
                identity="preempted",
            )
        ]


def probe(endpoint: str = ENDPOINT, timeout: float = 0.4) -> bool:
    """True when a GCE metadata server (it says ``Metadata-Flavor: Google``) answers."""
    try:
        resp = fetch("GET", endpoint.rstrip("/") + PREEMPTED_PATH, FLAVOR, timeout)
    except MetadataEndpointError:
        return False
    return resp.status == 200 and resp.headers.get("metadata-flavor") == "Google"


PLUGIN = DetectorPlugin(
    make=lambda endpoint, timeout, environ: GceDetector(endpoint or ENDPOINT, timeout=timeout),
    summary="GCE metadata: instance/preempted",
    probe=probe,
    endpoint=ENDPOINT,
    rank=1,
    aliases=("gce",),
)
