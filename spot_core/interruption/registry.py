"""Interruption notice detectors by name: the ``spot_pipelines.detectors`` entry-point group.

Every detector, the built-in ``aws``, ``gcp``, ``azure``, ``kubernetes`` and ``signal``
included, is an entry naming a ``DetectorPlugin`` (``spot_core.interruption.base``) in
its own module::

    [project.entry-points."spot_pipelines.detectors"]
    oci = "oci_spot.notices:PLUGIN"

so ``spot-pipelines watch --cloud``, ``@task.spot``'s ``cloud`` and ``auto``'s probes all
read one list. Names are read once without importing anything; a plugin is imported
the first time it is asked for (``auto`` asks every one that can be probed).
"""

from __future__ import annotations

from spot_core import plugins
from spot_core.interruption.base import DetectorPlugin

GROUP = "spot_pipelines.detectors"

_PLUGINS: plugins.Registry[DetectorPlugin] = plugins.Registry(
    GROUP,
    "notice detector",
    DetectorPlugin,
    lambda name, names: f"unknown cloud {name!r}: choose one of {', '.join((*names, 'auto'))}",
)


def detector_names() -> tuple[str, ...]:
    """Every installed detector's name, by rank (AWS, GCE, Azure, the node, SIGTERM, then
    other packages'), then name. Each is imported to read its rank: detectors are small."""
    return tuple(sorted(_PLUGINS.names(), key=lambda name: (detector_plugin(name).rank, name)))


def detector_plugin(name: str) -> DetectorPlugin:
    """The detector registered as ``name`` (imported on first use)."""
    return _PLUGINS.get(name)


def aliases() -> dict[str, str]:
    """Other names users give detectors (``ec2`` for ``aws``) -> their registered name."""
    return {alias: name for name in detector_names() for alias in detector_plugin(name).aliases}


def probed() -> tuple[str, ...]:
    """The detectors whose metadata service ``auto`` probes, in preference order."""
    return tuple(name for name in detector_names() if detector_plugin(name).probe is not None)
