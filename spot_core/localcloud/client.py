"""A client of the local cloud server with the same face as an in-process LocalSpotCloud.

The provider cannot tell the two apart: it launches, describes and terminates through
either, and prices with a TraceMarket rebuilt from the server's own configuration, so
every process that talks to one server sees the same trace at the same moment.

The server answers only with its token: given here, else read from the server's
``workdir`` (when named and readable), else ``$SPOT_LOCAL_CLOUD_TOKEN``. It is sent in a
header and kept out of ``repr``, options and logs.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.localcloud.cloud import InstanceView
from spot_core.localcloud.server import TOKEN_ENV, TOKEN_FILE, read_token, trace_from_dict
from spot_core.market.trace_market import TraceMarket
from spot_core.model import Pool

TIMEOUT_SECONDS = 10.0


class RemoteLocalCloud:
    """Talks to ``spot_core.localcloud.server`` at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        workdir: str | Path | None = None,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        if not isinstance(url, str) or not url.startswith("http://"):
            raise ConfigError(f"local cloud URL {url!r} must look like http://127.0.0.1:PORT")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._token = _token(self.url, token, workdir)
        self.clock = time.time
        config = self._call("GET", "/config")
        self.market = TraceMarket(
            [trace_from_dict(t) for t in config["traces"]],
            tick_origin=config["tick_origin"],
            time_scale=config["time_scale"],
        )
        self.workdir = Path(config["workdir"])

    def run_instance(
        self, pool: Pool, command: Sequence[str], env: Mapping[str, str], endpoint_env: str
    ) -> InstanceView:
        body = {
            "pool": pool.to_dict(),
            "command": list(command),
            "env": dict(env),
            "endpoint_env": endpoint_env,
        }
        return InstanceView(**self._call("POST", "/instances", body))

    def describe(self, instance_ids: Sequence[str]) -> dict[str, InstanceView]:
        views = self._call("POST", "/instances/describe", {"ids": list(instance_ids)})
        return {i: InstanceView(**v) for i, v in views.items()}

    def terminate_instance(self, instance_id: str) -> None:
        self._call("POST", f"/instances/{instance_id}/terminate", {})

    def log_tail(self, instance_id: str, lines: int = 5) -> str:
        tail: str = self._call("GET", f"/instances/{instance_id}/log?lines={lines}")["log"]
        return tail

    def stats(self) -> dict[str, Any]:
        """The server's request counts (``GET /stats``): per route, and describes per id."""
        stats: dict[str, Any] = self._call("GET", "/stats")  # the server's JSON
        return stats

    def shutdown(self) -> None:
        """Nothing to do: instances belong to the server and outlive this client."""

    def __repr__(self) -> str:  # never the token
        return f"RemoteLocalCloud({self.url!r})"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = _error_body(exc)
            if exc.code == 409 and detail.get("error") == "capacity_unavailable":
                raise CapacityUnavailable(detail.get("message", "no capacity")) from None
            if exc.code == 401:
                raise ConfigError(
                    f"local cloud {self.url} refused our token (401): use the "
                    f"token of the server at this URL (its workdir's {TOKEN_FILE}"
                    f", or ${TOKEN_ENV})"
                ) from None
            raise InfrastructureError(
                f"local cloud {self.url} answered {exc.code} to {method} "
                f"{path}: {detail.get('message', '')}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise InfrastructureError(
                f"local cloud {self.url} is not reachable ({exc}); start "
                "it with `python -m spot_core.localcloud.server --workdir "
                "DIR`"
            ) from None


def _token(url: str, token: str | None, workdir: str | Path | None) -> str:
    """The explicit token, else the token file of the server's ``workdir`` when one was
    named and is there, else ``$SPOT_LOCAL_CLOUD_TOKEN``: what names this server beats
    the environment, which may hold another server's token (a process that talks to
    two local clouds)."""
    if token:
        return token.strip()
    if workdir is not None and (Path(workdir) / TOKEN_FILE).is_file():
        return read_token(workdir)
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    where = "" if workdir is None else f" (no {TOKEN_FILE} in {workdir})"
    raise ConfigError(
        f"local cloud {url} needs its token{where}: set ${TOKEN_ENV}, or give "
        f"the server's workdir (provider option workdir=..., where it wrote "
        f"{TOKEN_FILE})"
    )


def _error_body(exc: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        body: dict[str, Any] = json.loads(exc.read())  # the server's JSON error object
        return body
    except (ValueError, OSError):
        return {}
