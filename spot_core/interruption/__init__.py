"""Interruption notices: detectors for AWS, GCE, Azure and SIGTERM, and the watcher.

from spot_core.interruption import InterruptionWatcher, detector_for
with InterruptionWatcher([detector_for("auto")], poll_interval=1.0) as watcher:
    watcher.add_handler(lambda notice: checkpointer.save_now())
    ...
"""

from __future__ import annotations

from spot_core.interruption.aws import AwsDetector
from spot_core.interruption.azure import AzureDetector
from spot_core.interruption.base import INTERRUPTION, REBALANCE, Detector, Notice
from spot_core.interruption.gce import GceDetector
from spot_core.interruption.notice_file import read_notice, write_notice
from spot_core.interruption.selection import (
    cloud_choices,
    detector_for,
    probe_cloud,
    validate_endpoint,
)
from spot_core.interruption.signals import SignalDetector
from spot_core.interruption.watcher import InterruptionWatcher

__all__ = [
    "AwsDetector",
    "AzureDetector",
    "Detector",
    "GceDetector",
    "cloud_choices",
    "INTERRUPTION",
    "InterruptionWatcher",
    "Notice",
    "REBALANCE",
    "SignalDetector",
    "detector_for",
    "probe_cloud",
    "read_notice",
    "validate_endpoint",
    "write_notice",
]
