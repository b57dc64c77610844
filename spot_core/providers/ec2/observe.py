"""Observing: the state of any number of leases from few calls (ended instances by id
and state filter, spot request codes by id or by listing), interruption notices from an
EventBridge queue and from the instances' own status reports, and how each lease ended."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core import attempt_env
from spot_core.adaptors import aws
from spot_core.checkpoint.status import parse_report, status_key
from spot_core.model import Lease, Market
from spot_core.providers import ec2_lean
from spot_core.providers.base import LeaseState, LeaseStatus
from spot_core.providers.ec2.instances import DESCRIBE_BATCH, Ec2Instances

log = logging.getLogger(__name__)

NOT_FOUND_GRACE = 120.0  # seconds after launch an id EC2 does not know yet is still starting
LIST_PAGE = 1000  # MaxResults of a listing (EC2's maximum; not allowed with ids)
ENDED_STATES = ("shutting-down", "terminated", "stopping", "stopped")  # not pending/running
ENDED_FILTER = ({"Name": "instance-state-name", "Values": list(ENDED_STATES)},)
LISTED_SPOT_STATES = ("open", "active")
LIST_SIZE_MEMORY = 600.0  # seconds a listing's size is trusted to predict the next one
NOTICE_CODES = frozenset({"marked-for-termination", "marked-for-stop", "marked-for-hibernation"})
RECLAIM_CODES = frozenset(
    {
        "instance-terminated-by-price",
        "instance-terminated-no-capacity",
        "instance-terminated-capacity-oversubscribed",
        "instance-terminated-launch-group-constraint",
        "instance-stopped-by-price",
        "instance-stopped-no-capacity",
    }
)
SPOT_RECLAIM_REASON = "Server.SpotInstanceTermination"
GB = 1 << 30
# A running spot instance's status report (where its watcher writes a notice at once) is
# read at most this often per lease: one GET, answered "absent" until a notice comes.
NODE_REPORT_SECONDS = 1.0
NODE_REPORT_THREADS = 16  # parallel reads of many leases' reports


class Ec2Observe(Ec2Instances):
    """``observe`` of ``Ec2Provider``."""

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        with ec2_lean.lean():
            return self._observe(leases)

    def _observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        self._drain_events()
        by_region: dict[str, list[Lease]] = {}
        for lease in leases:
            by_region.setdefault(lease.pool.region, []).append(lease)
        out: dict[str, LeaseStatus] = {}
        for region, group in by_region.items():
            ended = self._ended(region, [lease.lease_id for lease in group])
            spot_codes = self._spot_codes(region, self._spot_request_ids(region, group, ended))
            for lease_id in ended:
                self._report_read.pop(lease_id, None)
            self._read_node_notices([each for each in group if each.lease_id not in ended])
            for lease in group:
                out[lease.lease_id] = self._status(lease, ended, spot_codes)
        return out

    def _drain_events(self) -> None:
        if self._events is None:
            return
        try:
            for event in self._events.poll():
                if event.kind == "interruption":
                    self._notices.setdefault(event.instance_id, event.at)
                elif event.kind == "rebalance":  # handover=on_rebalance starts on it
                    self._rebalances.setdefault(event.instance_id, event.at)
        except Exception as exc:  # noqa: BLE001 - the queue is a hint; describe_instances is the truth
            log.warning("could not read interruption events: %s", exc)

    def _read_node_notices(self, running: Sequence[Lease]) -> None:
        """Notices the running spot instances' watchers wrote to their jobs' stores
        (``watch --report``), for those whose notice is not known yet; each lease's report
        at most every ``NODE_REPORT_SECONDS``, several at once."""
        now = time.monotonic()
        due = [
            lease
            for lease in running
            if lease.pool.is_spot
            and lease.details.get("checkpoint_uri")
            and lease.lease_id not in self._notices
            and now - self._report_read.get(lease.lease_id, -math.inf) >= NODE_REPORT_SECONDS
        ]
        for lease in due:
            self._report_read[lease.lease_id] = now
        if len(due) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(NODE_REPORT_THREADS, len(due))) as pool:
                reports = list(pool.map(self._agent_report, due))
        else:
            reports = [self._agent_report(lease) for lease in due]
        for lease, report in zip(due, reports, strict=True):
            if "notice_at" in report:
                self._notices.setdefault(lease.lease_id, report["notice_at"])

    def _ended(self, region: str, instance_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """The watched instances that are no longer pending or running: id -> description
        (None: EC2 does not know the id). Every id absent from the answer is alive."""
        return self._describe_in_batches(region, instance_ids, ENDED_FILTER)

    def _spot_request_ids(
        self, region: str, group: Sequence[Lease], ended: Mapping[str, dict[str, Any] | None]
    ) -> list[str]:
        """The spot request of each watched spot lease: from the launch (``details``),
        else from a description (an ended instance's, or, once per lease, a running one's)."""
        for lease_id in ended:  # an ended lease's request is read from its description
            self._request_ids.pop(lease_id, None)
        unknown = [
            each.lease_id
            for each in group
            if each.pool.market is Market.SPOT
            and not each.details.get("spot_request_id")
            and each.lease_id not in ended
            and each.lease_id not in self._request_ids
        ]
        if unknown:
            described = self._describe(region, unknown)
            self._request_ids.update(
                {i: str(described.get(i, {}).get("SpotInstanceRequestId", "")) for i in unknown}
            )
        requests = []
        for lease in group:
            request = (
                lease.details.get("spot_request_id")
                or (ended.get(lease.lease_id) or {}).get("SpotInstanceRequestId")
                or self._request_ids.get(lease.lease_id)
            )
            if request:
                requests.append(request)
        return requests

    def _listing_pays(self, what: str, region: str, wanted: int) -> bool:
        """Whether one listing (pages of ``LIST_PAGE``, sized as the last one in the past
        ``LIST_SIZE_MEMORY`` s, else as ``wanted``) takes fewer calls than by id."""
        if wanted <= DESCRIBE_BATCH:
            return False
        size, when = self._listed.get((what, region), (0, -LIST_SIZE_MEMORY))
        if time.monotonic() - when > LIST_SIZE_MEMORY:
            size = 0
        return -(-max(size, wanted) // LIST_PAGE) < -(-wanted // DESCRIBE_BATCH)

    def _spot_codes(self, region: str, requests: Sequence[str]) -> dict[str, str]:
        """instance id -> status code of its spot request, for the ``requests`` (ids)."""
        requests = list(requests)
        codes: dict[str, str] = {}
        if self._listing_pays("spot", region, len(requests)):
            listed = self._list_spot_requests(region)
            codes = {
                listed[rid].get("InstanceId", ""): listed[rid].get("Status", {}).get("Code", "")
                for rid in requests
                if rid in listed
            }
            requests = [rid for rid in requests if rid not in listed]
        for start in range(0, len(requests), DESCRIBE_BATCH):  # as many ids per call
            answer = aws.call(
                f"ec2:DescribeSpotInstanceRequests in {region}",
                self.clients[region].describe_spot_instance_requests,
                SpotInstanceRequestIds=requests[start : start + DESCRIBE_BATCH],
            )
            codes.update(
                {
                    r.get("InstanceId", ""): r.get("Status", {}).get("Code", "")
                    for r in answer.get("SpotInstanceRequests", [])
                }
            )
        return codes

    def _list_spot_requests(self, region: str) -> dict[str, dict[str, Any]]:
        """The region's open and active spot requests (a closed one is asked by id)."""
        client = self.clients[region]
        pages = aws.call(
            f"ec2:DescribeSpotInstanceRequests in {region}",
            lambda: list(
                client.get_paginator("describe_spot_instance_requests").paginate(
                    Filters=[{"Name": "state", "Values": list(LISTED_SPOT_STATES)}],
                    PaginationConfig={"PageSize": LIST_PAGE},
                )
            ),
        )
        listed = {
            r["SpotInstanceRequestId"]: r
            for page in pages
            for r in page.get("SpotInstanceRequests", [])
        }
        self._listed[("spot", region)] = (len(listed), time.monotonic())
        return listed

    def _status(
        self,
        lease: Lease,
        ended: Mapping[str, dict[str, Any] | None],
        spot_codes: Mapping[str, str],
    ) -> LeaseStatus:
        code = spot_codes.get(lease.lease_id, "")
        if code in NOTICE_CODES:
            self._notices.setdefault(lease.lease_id, self.clock())
        notice = self._notices.get(lease.lease_id)
        if lease.lease_id not in ended or self._not_visible_yet(lease, ended):
            return LeaseStatus(
                LeaseState.RUNNING,
                notice_at=notice,
                rebalance_at=self._rebalances.get(lease.lease_id),
            )
        return self._ended_status(lease, ended[lease.lease_id] or {}, code, notice)

    def _not_visible_yet(self, lease: Lease, ended: Mapping[str, dict[str, Any] | None]) -> bool:
        """EC2's API is eventually consistent: an instance just launched can be unknown to
        DescribeInstances for a while. Within ``NOT_FOUND_GRACE`` of its launch such a
        lease is still starting, not gone."""
        return ended[lease.lease_id] is None and self.clock() - lease.started_at < NOT_FOUND_GRACE

    def _ended_status(
        self, lease: Lease, instance: Mapping[str, Any], code: str, notice: float | None
    ) -> LeaseStatus:
        reason = instance.get("StateReason", {}).get("Code", "")
        agent = self._agent_report(lease)
        ended = float(agent.get("ended_at") or self.clock())
        exit_code = agent.get("exit_code")
        notice = _precise_notice(notice, agent.get("notice_at"))
        by_aws = reason == SPOT_RECLAIM_REASON or code in RECLAIM_CODES
        if exit_code == 0:
            return LeaseStatus(LeaseState.EXITED, exit_code=0, notice_at=notice, ended_at=ended)
        if by_aws:
            return LeaseStatus(
                LeaseState.RECLAIMED,
                exit_code=exit_code,
                notice_at=notice or ended,
                ended_at=ended,
                message=f"spot capacity reclaimed ({reason or code})",
            )
        if exit_code == attempt_env.DRIVER_LOST_EXIT_CODE and notice is None:
            return LeaseStatus(
                LeaseState.TERMINATED,
                exit_code=int(exit_code),
                ended_at=ended,
                message=f"{lease.lease_id} ended itself: its driver stopped "
                "renewing the heartbeat for longer than the timeout",
            )
        if exit_code is not None:
            why = "after an interruption notice" if notice is not None else "on its own"
            return LeaseStatus(
                LeaseState.EXITED,
                exit_code=int(exit_code),
                notice_at=notice,
                ended_at=ended,
                message=f"the step exited with code {exit_code} {why} on {lease.lease_id}",
            )
        if lease.lease_id in self._terminated:
            return LeaseStatus(
                LeaseState.TERMINATED,
                notice_at=notice,
                ended_at=ended,
                message="terminated by the controller",
            )
        if notice is not None:
            return LeaseStatus(
                LeaseState.RECLAIMED,
                notice_at=notice,
                ended_at=ended,
                message="reclaimed after an interruption notice",
            )
        return LeaseStatus(
            LeaseState.TERMINATED,
            ended_at=ended,
            message=f"{lease.lease_id} ended ({reason or 'no reason given'}) "
            "without a status report from its agent",
        )

    def _agent_report(self, lease: Lease) -> dict[str, Any]:
        uri = lease.details.get("checkpoint_uri")
        if not uri:
            return {}
        try:
            store = self.open_store(uri, region=lease.details.get("checkpoint_region"))
            return parse_report(store.get_object(status_key(lease.attempt)))
        except FileNotFoundError:
            return {}
        except Exception as exc:  # noqa: BLE001 - a missing report only makes the outcome less precise
            log.warning("could not read the status report of %s: %s", lease.lease_id, exc)
            return {}


def _precise_notice(seen_at: float | None, node_at: float | None) -> float | None:
    """When the notice came: EventBridge stamps its events in whole seconds, so one seen
    there came within ``[seen_at, seen_at + 1)``; the node's watcher stamps its first sight
    to the millisecond, a poll after the notice. Within that second the node's is the
    truer time (a time to resume measured from the truncated one reads up to 1 s long)."""
    if seen_at is None:
        return node_at
    if node_at is not None and seen_at <= node_at < seen_at + 1.0:
        return node_at
    return seen_at
