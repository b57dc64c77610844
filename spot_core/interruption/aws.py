"""EC2 spot interruption and rebalance notices through IMDSv2.

IMDSv2 wants a session token from ``PUT /latest/api/token`` on every GET; instances
that enforce it answer 401 to a GET without one or with an expired one. The detector
keeps one token, renews it before it expires, and on a 401 fetches a fresh token and
retries once (the service may have been restarted, or the token revoked).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from spot_core.errors import MetadataEndpointError
from spot_core.interruption.base import (
    INTERRUPTION,
    REBALANCE,
    DetectorPlugin,
    Notice,
    parse_rfc3339,
)
from spot_core.interruption.endpoint import (
    DEFAULT_TIMEOUT,
    Check,
    HttpDetector,
    Response,
    bad_answer,
    check_status,
)

ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL = 21600
ACTIONS = ("terminate", "stop", "hibernate")


class AwsDetector(HttpDetector):
    """Polls the spot ``instance-action`` and the rebalance recommendation."""

    name = "aws"

    def __init__(
        self,
        endpoint: str = ENDPOINT,
        timeout: float = DEFAULT_TIMEOUT,
        token_ttl: int = MAX_TTL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= int(token_ttl) <= MAX_TTL:
            raise ValueError(f"token_ttl must be 1..{MAX_TTL} seconds, got {token_ttl}")
        super().__init__(endpoint, timeout)
        self.token_ttl = int(token_ttl)
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_expires = 0.0

    def checks(self) -> list[Check]:
        return [self._instance_action, self._rebalance]

    def _instance_action(self, now: float) -> list[Notice]:
        resp = self._get(INSTANCE_ACTION_PATH)
        if resp.status == 404:
            return []
        check_status("aws instance-action", resp)
        doc = _json_object(resp.body, "instance-action")
        action, when = doc.get("action"), doc.get("time")
        if action not in ACTIONS:
            raise bad_answer("aws", "instance-action action", resp.body)
        if not isinstance(when, str):  # what _timestamp refuses too
            raise bad_answer("aws", "timestamp", resp.body)
        deadline = _timestamp(when, resp.body)
        return [Notice(INTERRUPTION, "aws", action, deadline, now, raw=doc, identity=when)]

    def _rebalance(self, now: float) -> list[Notice]:
        resp = self._get(REBALANCE_PATH)
        if resp.status == 404:
            return []
        check_status("aws rebalance", resp)
        doc = _json_object(resp.body, "rebalance recommendation")
        notice_time = doc.get("noticeTime")
        if not isinstance(notice_time, str):  # what _timestamp refuses too
            raise bad_answer("aws", "timestamp", resp.body)
        _timestamp(notice_time, resp.body)
        return [Notice(REBALANCE, "aws", "rebalance", None, now, raw=doc, identity=notice_time)]

    def metadata(self, path: str) -> str:
        """One metadata value (e.g. ``/latest/meta-data/instance-id``), with the token."""
        resp = self._get(path)
        check_status(f"aws {path}", resp)
        return resp.body.strip()

    def _get(self, path: str) -> Response:
        """GET with the session token; one retry with a fresh token on 401."""
        resp = self.fetch("GET", path, {TOKEN_HEADER: self._current_token()})
        if resp.status == 401:
            self._token = None
            resp = self.fetch("GET", path, {TOKEN_HEADER: self._current_token()})
        return resp

    def _current_token(self) -> str:
        """Renew a little before expiry so a GET never carries a token about to lapse."""
        margin = min(60.0, self.token_ttl * 0.1)
        if self._token is None or self._monotonic() >= self._token_expires - margin:
            self._token = self._new_token()
            self._token_expires = self._monotonic() + self.token_ttl
        return self._token

    def _new_token(self) -> str:
        resp = self.fetch("PUT", TOKEN_PATH, {TTL_HEADER: str(self.token_ttl)})
        check_status("aws token", resp)
        token = resp.body.strip()
        if not token or len(token) > 4096:
            raise bad_answer("aws", "token", resp.body)
        return token


def _json_object(body: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise bad_answer("aws", f"{what} (not JSON)", body) from exc
    if not isinstance(doc, dict):
        raise bad_answer("aws", f"{what} (not an object)", body)
    return doc


def _timestamp(text: Any, body: str) -> float:
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise bad_answer("aws", "timestamp", body) from exc


def probe(endpoint: str = ENDPOINT, timeout: float = 0.4) -> bool:
    """True when an IMDSv2 token service answers at ``endpoint``."""
    try:
        return bool(AwsDetector(endpoint, timeout, token_ttl=60)._new_token())
    except MetadataEndpointError:
        return False


PLUGIN = DetectorPlugin(
    make=lambda endpoint, timeout, environ: AwsDetector(endpoint or ENDPOINT, timeout=timeout),
    summary="AWS IMDSv2: spot instance-action and rebalance recommendations",
    probe=probe,
    endpoint=ENDPOINT,
    rank=0,
    aliases=("ec2",),
)
