"""The Kubernetes edge: lazy ``kubernetes`` client, API clients, error translation.

Nothing else in ``spot_core`` imports the ``kubernetes`` package, so the core installs
without it. Every API error crosses into spot-pipelines here as a ``SpotError`` whose
class says what the controller should do: ``NotFound`` (404, the object is gone: callers
decide what that means), ``ConfigError`` (401/403/400/422: credentials, RBAC or a pod
the API refuses; never retried) and ``InfrastructureError`` (409, 429, 5xx, connection
errors; retryable). Every call carries a request timeout, so no call waits unbounded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from spot_core import stopping
from spot_core.adaptors import extras
from spot_core.errors import ConfigError, InfrastructureError, SpotError

T = TypeVar("T")

REQUEST_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds for every API call
RETRIES = 3  # rounds for 429 / 5xx / connection errors, jittered
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class NotFound(SpotError):
    """The API answered 404: the object (a pod, a node) does not exist (any more)."""


def kubernetes() -> ModuleType:
    """Import the official client on first use, with a message that names the extra."""
    return extras.require("kubernetes")


def in_cluster_available() -> bool:
    """True inside a pod whose service account token is mounted."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


def api_client(
    *, kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None
) -> Any:
    """An ``ApiClient`` from the pod's service account (``in_cluster``), or a kubeconfig
    file (default ``$KUBECONFIG`` or ``~/.kube/config``) and context. ``in_cluster=None``:
    the service account when there is one, else the kubeconfig."""
    k8s = kubernetes()
    configuration = k8s.client.Configuration()
    if in_cluster is None:
        in_cluster = kubeconfig is None and context is None and in_cluster_available()
    try:
        if in_cluster:
            k8s.config.load_incluster_config(client_configuration=configuration)
        else:
            k8s.config.load_kube_config(
                config_file=kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (k8s.config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = (
            "the pod's service account"
            if in_cluster
            else f"kubeconfig {kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
            + (f" context {context!r}" if context else "")
        )
        raise ConfigError(
            f"cannot load Kubernetes credentials from {where}: {exc}; pass "
            "the kubeconfig / context options or in_cluster=True"
        ) from None
    return k8s.client.ApiClient(configuration)


def api_client_from_dict(
    config: Any, context: str | None = None, *, source: str = "the kubeconfig given"
) -> Any:
    """An ``ApiClient`` from a kubeconfig's contents held in memory (a Prefect
    ``KubernetesClusterConfig`` block's), so an engine's stored credentials reach the
    provider without a kubeconfig file of ours on disk. ``source`` names where the
    contents came from in the one-line error."""
    k8s = kubernetes()
    configuration = k8s.client.Configuration()
    try:
        k8s.config.load_kube_config_from_dict(
            config_dict=dict(config),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (k8s.config.ConfigException, OSError, ValueError, TypeError) as exc:
        shown = f"{source}" + (f" context {context!r}" if context else "")
        raise ConfigError(
            f"cannot load Kubernetes credentials from {shown}: {exc}; give "
            "a kubeconfig whose context names a cluster and a user"
        ) from None
    return k8s.client.ApiClient(configuration)


def core_api(client: Any) -> Any:
    return kubernetes().client.CoreV1Api(client)


def call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with a request timeout, a few bounded retries of transient
    errors, and every failure translated (see the module docstring)."""
    k8s = kubernetes()
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    for round_ in range(RETRIES):
        try:
            return fn(*args, **kwargs)
        except k8s.client.exceptions.ApiException as exc:
            error = translate(what, exc.status, exc.reason, exc.body)
        except Exception as exc:  # noqa: BLE001 - urllib3 connection errors and timeouts
            if isinstance(exc, SpotError):
                raise
            error = InfrastructureError(
                f"{what}: the Kubernetes API is unreachable ({type(exc).__name__}: {exc})"
            )
        if not error.retryable or round_ == RETRIES - 1:
            raise error
        stopping.sleep(0.2 * (2**round_))  # between calls: a safe place for a stop
    raise AssertionError("unreachable")


def translate(what: str, status: int | None, reason: str | None, body: Any) -> SpotError:
    """One API error as a SpotError whose message says what to fix."""
    message = api_message(body) or reason or "no message"
    if status == 404:
        return NotFound(f"{what}: not found ({message})")
    if status in (401, 403):
        return ConfigError(
            f"{what}: the Kubernetes API refused access ({status}: {message}); "
            "grant the role in deploy/kubernetes/rbac.yaml (see "
            "docs/kubernetes.md) or fix the kubeconfig's credentials"
        )
    if status in (400, 422):
        return ConfigError(
            f"{what}: the Kubernetes API rejected the request ({message}); "
            "check pod_template, image and namespace"
        )
    return InfrastructureError(f"{what}: the Kubernetes API answered {status} ({message})")


def api_message(body: Any) -> str:
    """The ``message`` of a Status object in an error body, if it has one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    return str(status.get("message", ""))[:300] if isinstance(status, dict) else ""


def raw(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The API's JSON for a call (``_preload_content=False``): the objects exactly as the
    server sent them, which is what the pure classifiers read."""
    response = call(what, fn, *args, _preload_content=False, **kwargs)
    try:
        document: dict[str, Any] = json.loads(response.data)  # an API object, as JSON
        return document
    except ValueError as exc:
        raise InfrastructureError(f"{what}: the Kubernetes API answered no JSON ({exc})") from None
