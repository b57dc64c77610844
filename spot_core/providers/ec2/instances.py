"""What every part of the EC2 provider shares: its state, declared once, and the calls on
instances that launch, observe and cleanup all make (describe by id, terminate, list the
live ones this project tagged)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spot_core.adaptors import aws
from spot_core.errors import ConfigError, InfrastructureError
from spot_core.providers.ec2.options import TAG_MANAGED, Ec2Options

if TYPE_CHECKING:
    from spot_core.checkpoint.store import CheckpointStore
    from spot_core.interruption.eventbridge import EventQueue
    from spot_core.market.ec2 import Ec2Market
    from spot_core.model import Lease

log = logging.getLogger(__name__)

DESCRIBE_BATCH = 500  # ids per describe by id
LIVE_STATES = ("pending", "running", "stopping", "stopped")


class Ec2Instances:
    """The provider's state (set by ``Ec2Provider.__init__``) and its calls on instances."""

    config: Ec2Options
    access: aws.AwsAccess
    clock: Callable[[], float]
    clients: dict[str, Any]
    market: Ec2Market
    _zones: dict[str, dict[str, tuple[str, ...]]]
    _listed: dict[tuple[str, str], tuple[int, float]]  # (what, region) -> size, when
    _request_ids: dict[str, str]  # instance id -> spot request id ("" for none)
    _events: EventQueue | None
    _lock: threading.Lock
    _leases: dict[str, Lease]
    _terminated: set[str]
    _notices: dict[str, float]
    _report_read: dict[str, float]  # instance id -> last read (monotonic)
    _rebalances: dict[str, float]  # instance id -> rebalance recommendation

    def open_store(self, uri: str, region: str | None = None) -> CheckpointStore:
        """The job's checkpoint store, reached with this provider's credentials and
        endpoint (the controller opens every store of its jobs through here)."""
        from spot_core.checkpoint import open_store

        if not uri.startswith("s3://"):
            return open_store(uri)
        # The stores share one S3 client per region (``aws.shared_client``).
        return open_store(
            uri,
            session=self.access,
            endpoint_url=self.config.endpoint_url,
            region=region or self.config.checkpoint_region,
        )

    def _describe(self, region: str, instance_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Instance id -> description; an unknown id is left out."""
        return {
            i: d
            for i, d in self._describe_in_batches(region, instance_ids).items()
            if d is not None
        }

    def _describe_in_batches(
        self, region: str, instance_ids: Sequence[str], filters: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, dict[str, Any] | None]:
        """``_describe_batch`` over ``DESCRIBE_BATCH`` ids per call."""
        found: dict[str, dict[str, Any] | None] = {}
        for start in range(0, len(instance_ids), DESCRIBE_BATCH):
            found.update(
                self._describe_batch(
                    region, list(instance_ids[start : start + DESCRIBE_BATCH]), filters
                )
            )
        return found

    def _describe_batch(
        self, region: str, ids: list[str], filters: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, dict[str, Any] | None]:
        """The ids' descriptions that match ``filters``; an id EC2 does not know maps to
        None (EC2 refuses the whole call for one unknown id: it is found by halving)."""
        if not ids:
            return {}
        client = self.clients[region]
        query: dict[str, Any] = {
            "InstanceIds": ids,
            **({"Filters": list(filters)} if filters else {}),
        }
        try:
            pages = aws.call_raw(
                lambda: list(client.get_paginator("describe_instances").paginate(**query))
            )
        except aws.client_error_class() as exc:
            if aws.error_code(exc) != "InvalidInstanceID.NotFound":
                raise aws.translate(exc, f"ec2:DescribeInstances in {region}") from exc
            if len(ids) == 1:
                return {ids[0]: None}
            half = len(ids) // 2  # find the unknown ids by halving; rare
            return {
                **self._describe_batch(region, ids[:half], filters),
                **self._describe_batch(region, ids[half:], filters),
            }
        return {
            i["InstanceId"]: i
            for page in pages
            for r in page["Reservations"]
            for i in r["Instances"]
        }

    def instance_tag(self, region: str, instance_id: str, key: str) -> str | None:
        """The value of tag ``key`` on an instance (terminated ones stay describable for
        a while), or None if it has no such tag or is unknown."""
        client = self.clients.get(region)
        if client is None:
            raise ConfigError(
                f"instance {instance_id} is in region {region!r}, which this "
                f"provider does not use ({list(self.clients)})"
            )
        instance = self._describe_batch(region, [instance_id]).get(instance_id) or {}
        return next((t.get("Value") for t in instance.get("Tags", []) if t.get("Key") == key), None)

    def _terminate_ids(self, region: str, ids: Sequence[str]) -> None:
        for start in range(0, len(ids), 1000):
            batch = list(ids[start : start + 1000])
            try:
                aws.call(
                    f"ec2:TerminateInstances in {region}",
                    self.clients[region].terminate_instances,
                    InstanceIds=batch,
                )
            except InfrastructureError as exc:
                if "InvalidInstanceID.NotFound" not in str(exc):
                    raise
                for one in batch if len(batch) > 1 else ():
                    self._terminate_ids(region, [one])

    def _live_tagged(self, region: str, filters: list[dict[str, Any]]) -> list[str]:
        """The ids of the live instances this project launched in ``region`` that match
        ``filters`` as well."""
        client = self.clients[region]
        filters = [
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            *filters,
        ]
        pages = aws.call(
            f"ec2:DescribeInstances in {region}",
            lambda: list(client.get_paginator("describe_instances").paginate(Filters=filters)),
        )
        return [
            i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]
        ]
