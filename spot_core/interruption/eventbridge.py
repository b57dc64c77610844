"""Interruption events from EventBridge, read off an SQS queue (optional).

An EventBridge rule matching ``source: aws.ec2`` and ``detail-type`` "EC2 Spot Instance
Interruption Warning" / "EC2 Instance Rebalance Recommendation" with the queue as its
target gives the controller side the same two-minute notice the instance sees through
IMDS, without polling each instance. ``EventQueue.poll`` drains what is there (bounded:
a few receive calls, no long wait unless asked) and deletes what it read.

Rule (``aws events put-rule``): ``{"source": ["aws.ec2"], "detail-type": ["EC2 Spot
Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]}``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
KINDS = {INTERRUPTION: "interruption", REBALANCE: "rebalance"}


@dataclass(frozen=True)
class InstanceEvent:
    instance_id: str
    kind: str  # "interruption" | "rebalance"
    at: float  # the event's time (POSIX seconds)
    action: str | None = None


def parse_event(body: str) -> InstanceEvent | None:
    """One SQS message body (an EventBridge event) -> InstanceEvent, or None if not ours."""
    try:
        event = json.loads(body)
        kind = KINDS.get(event.get("detail-type", ""))
        if kind is None or event.get("source") != "aws.ec2":
            return None
        detail = event.get("detail") or {}
        at = datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00")).timestamp()
        return InstanceEvent(str(detail["instance-id"]), kind, at, detail.get("instance-action"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def interruption_event(
    instance_id: str, at: float, region: str = "us-east-1", kind: str = "interruption"
) -> dict[str, Any]:
    """The event as EventBridge delivers it (used by the instance runtime harness)."""

    detail_type = INTERRUPTION if kind == "interruption" else REBALANCE
    detail = {"instance-id": instance_id}
    if kind == "interruption":
        detail["instance-action"] = "terminate"
    return {
        "version": "0",
        "id": f"evt-{instance_id}-{int(at)}",
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": "123456789012",
        "time": datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:ec2:{region}:123456789012:instance/{instance_id}"],
        "detail": detail,
    }


class EventQueue:
    """Drains EventBridge instance events from one SQS queue."""

    def __init__(
        self, client: Any, queue_url: str, *, max_batches: int = 5, wait_seconds: int = 0
    ) -> None:
        self.client, self.queue_url = client, queue_url
        self.max_batches, self.wait_seconds = max_batches, wait_seconds

    def poll(self) -> list[InstanceEvent]:
        from spot_core.adaptors import aws

        events: list[InstanceEvent] = []
        for _ in range(self.max_batches):
            answer = aws.call(
                "sqs:ReceiveMessage",
                self.client.receive_message,
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=self.wait_seconds,
            )
            messages = answer.get("Messages", [])
            if not messages:
                break
            for message in messages:
                event = parse_event(message.get("Body", ""))
                if event is not None:
                    events.append(event)
            aws.call(
                "sqs:DeleteMessageBatch",
                self.client.delete_message_batch,
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
            if len(messages) < 10:
                break
        return events
