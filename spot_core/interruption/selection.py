"""Choosing a detector by cloud name, or by asking which metadata service answers.

``auto`` probes the three services in parallel with a short timeout (off-cloud, the
link-local addresses just time out) and prefers AWS, then GCE, then Azure when more
than one answers; when none does, SIGTERM is the only notice there will be.

``kubernetes`` (a step in a pod) watches its own node's taints through the API, plus the
node's cloud metadata where the pod can reach it (probed as ``auto`` does), plus SIGTERM;
``auto`` inside a pod launched by the kubernetes provider (``SPOT_NODE_NAME`` set) adds the
node detector to whatever it probed. ``detectors_for`` returns that whole list.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from typing import Callable

from spot_core import attempt_env
from spot_core.errors import ConfigError
from spot_core.interruption import aws, azure, gce
from spot_core.interruption import kubernetes as k8s
from spot_core.interruption.base import Detector
from spot_core.interruption.endpoint import DEFAULT_TIMEOUT
from spot_core.interruption.signals import SignalDetector

CLOUDS = ("aws", "gcp", "azure", "kubernetes", "signal")
CHOICES = (*CLOUDS, "auto")
ALIASES = {"gce": "gcp", "ec2": "aws", "k8s": "kubernetes"}
DEFAULT_ENDPOINTS = {"aws": aws.ENDPOINT, "gcp": gce.ENDPOINT, "azure": azure.ENDPOINT}
PROBES: dict[str, Callable[[str, float], bool]] = {
    "aws": aws.probe, "gcp": gce.probe, "azure": azure.probe}
PROBE_TIMEOUT = 0.4


def normalize_cloud(cloud: str) -> str:
    """Lower-case and de-alias a cloud name; ConfigError naming the valid choices."""
    name = ALIASES.get(cloud.strip().lower(), cloud.strip().lower())
    if name not in CHOICES:
        raise ConfigError(f"unknown cloud {cloud!r}: choose one of {', '.join(CHOICES)}")
    return name


def validate_endpoint(endpoint: str) -> str:
    """An endpoint is ``http(s)://HOST[:PORT]``; ConfigError saying so otherwise."""
    parts = urllib.parse.urlsplit(endpoint.strip())
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok \
            or parts.query or parts.fragment:
        raise ConfigError(f"malformed metadata endpoint {endpoint!r}: use "
                          "http://HOST[:PORT], e.g. http://169.254.169.254")
    return endpoint.strip().rstrip("/")


def resolve_endpoint(endpoint: str | None) -> str | None:
    """An explicit endpoint wins, then SPOT_METADATA_ENDPOINT, else each cloud's default."""
    chosen = endpoint or os.environ.get(attempt_env.METADATA_ENDPOINT) or None
    return None if chosen is None else validate_endpoint(chosen)


def detector_for(cloud: str, endpoint: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT,
                 probe_timeout: float = PROBE_TIMEOUT) -> Detector:
    """The detector for ``cloud``; ``auto`` probes, falling back to SIGTERM only.

    A ``signal`` detector installs a SIGTERM handler, so call this in the main thread.
    """
    name = normalize_cloud(cloud)
    url = resolve_endpoint(endpoint)
    if not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if name == "auto":
        name = probe_cloud(url, probe_timeout) or "signal"
    if name == "kubernetes":
        return _node_detector(os.environ)
    if name == "signal":
        return SignalDetector()
    target = url or DEFAULT_ENDPOINTS[name]
    factories = {"aws": aws.AwsDetector, "gcp": gce.GceDetector,
                 "azure": azure.AzureDetector}
    return factories[name](target, timeout=timeout)


def detectors_for(cloud: str, endpoint: str | None = None, *,
                  timeout: float = DEFAULT_TIMEOUT,
                  probe_timeout: float = PROBE_TIMEOUT) -> list[Detector]:
    """Every detector a watcher runs for ``cloud``, SIGTERM first (main thread only).

    ``kubernetes``: the node's taints, plus its cloud's metadata if a service answers.
    ``auto`` in a pod of the kubernetes provider: the probed cloud's plus the node's."""
    name = normalize_cloud(cloud)
    in_pod = k8s.node_name_from_env() is not None
    if name == "kubernetes" or (name == "auto" and in_pod):
        node = _node_detector(os.environ)  # first: a refusal leaves no signal handler
        found = [SignalDetector(), node]
        probed = probe_cloud(resolve_endpoint(endpoint), probe_timeout)
        if probed is not None:
            found.append(detector_for(probed, endpoint, timeout=timeout))
        return found
    detector = detector_for(name, endpoint, timeout=timeout, probe_timeout=probe_timeout)
    return [detector] if isinstance(detector, SignalDetector) else [SignalDetector(), detector]


def _node_detector(environ) -> Detector:
    node = k8s.node_name_from_env(environ)
    if node is None:
        raise ConfigError(f"--cloud kubernetes needs the pod's node name in ${k8s.NODE_NAME_ENV} "
                          "(the kubernetes provider sets it from the downward API: env "
                          "valueFrom.fieldRef.fieldPath: spec.nodeName)")
    return k8s.KubernetesNodeDetector(node)


def probe_cloud(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Which metadata service answers (``aws``, ``gcp``, ``azure``), or None.

    The probes run in parallel, so this takes at most about one ``timeout``.
    """
    answers: dict[str, bool] = {}

    def ask(name: str) -> None:
        answers[name] = PROBES[name](endpoint or DEFAULT_ENDPOINTS[name], timeout)

    threads = [threading.Thread(target=ask, args=(name,), daemon=True) for name in PROBES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout * 3 + 1.0)
    return next((name for name in PROBES if answers.get(name)), None)
