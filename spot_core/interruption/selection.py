"""Choosing a detector by cloud name, or by asking which metadata service answers.

The names are the detector registry's (``spot_core.interruption.registry``: ``aws``,
``gcp``, ``azure``, ``kubernetes``, ``signal`` and any installed package's). ``auto``
probes every registered metadata service in parallel with a short timeout (off-cloud,
the link-local addresses just time out) and prefers them in registry order (AWS, then
GCE, then Azure) when more than one answers; when none does, SIGTERM is the only notice
there will be.

``kubernetes`` (a step in a pod) watches its own node's taints through the API, plus the
node's cloud metadata where the pod can reach it (probed as ``auto`` does), plus SIGTERM;
``auto`` inside a pod launched by the kubernetes provider (``SPOT_NODE_NAME`` set) adds the
node detector to whatever it probed. ``detectors_for`` returns that whole list.
"""

from __future__ import annotations

import os
import threading
import urllib.parse

from spot_core import attempt_env
from spot_core.errors import ConfigError
from spot_core.interruption import registry
from spot_core.interruption.base import Detector
from spot_core.interruption.endpoint import DEFAULT_TIMEOUT
from spot_core.interruption.kubernetes import node_detector, node_name_from_env
from spot_core.interruption.signals import SignalDetector

AUTO = "auto"
NODE = "kubernetes"  # the detector of a pod's own node (see the module docstring)
PROBE_TIMEOUT = 0.4


def cloud_choices() -> tuple[str, ...]:
    """What ``--cloud`` (and ``@task.spot``'s ``cloud``) accepts: every registered
    detector, then ``auto``."""
    return (*registry.detector_names(), AUTO)


def normalize_cloud(cloud: str) -> str:
    """Lower-case and de-alias a cloud name; ConfigError naming the valid choices."""
    text = cloud.strip().lower()
    name = registry.aliases().get(text, text)
    if name not in cloud_choices():
        raise ConfigError(f"unknown cloud {cloud!r}: choose one of {', '.join(cloud_choices())}")
    return name


def validate_endpoint(endpoint: str) -> str:
    """An endpoint is ``http(s)://HOST[:PORT]``; ConfigError saying so otherwise."""
    parts = urllib.parse.urlsplit(endpoint.strip())
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or not port_ok
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(
            f"malformed metadata endpoint {endpoint!r}: use "
            "http://HOST[:PORT], e.g. http://169.254.169.254"
        )
    return endpoint.strip().rstrip("/")


def resolve_endpoint(endpoint: str | None) -> str | None:
    """An explicit endpoint wins, then SPOT_METADATA_ENDPOINT, else each cloud's default."""
    chosen = endpoint or os.environ.get(attempt_env.METADATA_ENDPOINT) or None
    return None if chosen is None else validate_endpoint(chosen)


def detector_for(
    cloud: str,
    endpoint: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    probe_timeout: float = PROBE_TIMEOUT,
) -> Detector:
    """The detector for ``cloud``; ``auto`` probes, falling back to SIGTERM only.

    A ``signal`` detector installs a SIGTERM handler, so call this in the main thread.
    """
    name = normalize_cloud(cloud)
    url = resolve_endpoint(endpoint)
    if not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if name == AUTO:
        name = probe_cloud(url, probe_timeout) or "signal"
    return registry.detector_plugin(name).make(url, timeout, os.environ)


def detectors_for(
    cloud: str,
    endpoint: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    probe_timeout: float = PROBE_TIMEOUT,
) -> list[Detector]:
    """Every detector a watcher runs for ``cloud``, SIGTERM first (main thread only).

    ``kubernetes``: the node's taints, plus its cloud's metadata if a service answers.
    ``auto`` in a pod of the kubernetes provider: the probed cloud's plus the node's."""
    name = normalize_cloud(cloud)
    in_pod = node_name_from_env() is not None
    if name == NODE or (name == AUTO and in_pod):
        node = node_detector(os.environ)  # first: a refusal leaves no signal handler
        found: list[Detector] = [SignalDetector(), node]
        probed = probe_cloud(resolve_endpoint(endpoint), probe_timeout)
        if probed is not None:
            found.append(detector_for(probed, endpoint, timeout=timeout))
        return found
    detector = detector_for(name, endpoint, timeout=timeout, probe_timeout=probe_timeout)
    return [detector] if isinstance(detector, SignalDetector) else [SignalDetector(), detector]


def probe_cloud(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Which metadata service answers (``aws``, ``gcp``, ``azure``, or another registered
    detector that can be probed), or None; the first in registry order wins.

    The probes run in parallel, so this takes at most about one ``timeout``.
    """
    answers: dict[str, bool] = {}
    plugins = {name: registry.detector_plugin(name) for name in registry.probed()}

    def ask(name: str) -> None:
        plugin = plugins[name]
        where = endpoint or plugin.endpoint
        if plugin.probe is None or where is None:  # no probe, or nowhere to send it
            answers[name] = False
            return
        answers[name] = plugin.probe(where, timeout)

    threads = [threading.Thread(target=ask, args=(name,), daemon=True) for name in plugins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout * 3 + 1.0)
    return next((name for name in plugins if answers.get(name)), None)
