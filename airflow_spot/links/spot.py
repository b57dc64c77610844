"""Extra links on spot tasks: where the job checkpoints, and its EC2 instance when on EC2."""

from __future__ import annotations

import urllib.parse
from typing import Any, ClassVar

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom


class _XComLink(BaseOperatorLink):
    """A link whose URL the task stored in XCom under ``key`` while it ran."""

    name: ClassVar[str]
    key: ClassVar[str]

    def get_link(self, operator, *, ti_key) -> str:
        try:
            value = XCom.get_value(key=self.key, ti_key=ti_key)
        except Exception:  # noqa: BLE001 - a missing link must never break the UI
            return ""
        return value if isinstance(value, str) else ""

    @classmethod
    def persist(cls, context: Any, url: str) -> None:
        """Store ``url`` ("" for none yet: the UI then shows no link, and nothing errs)."""
        context["ti"].xcom_push(key=cls.key, value=url)


class SpotCheckpointLink(_XComLink):
    name = "Checkpoints"
    key = "spot_checkpoint_link"

    @staticmethod
    def url_for(checkpoint_uri: str) -> str:
        """The S3 console for ``s3://`` stores; the ``file://`` URI itself otherwise."""
        parts = urllib.parse.urlsplit(checkpoint_uri)
        if parts.scheme == "s3":
            prefix = urllib.parse.quote(parts.path.lstrip("/").rstrip("/") + "/")
            return f"https://s3.console.aws.amazon.com/s3/buckets/{parts.netloc}?prefix={prefix}"
        return checkpoint_uri


class SpotEc2InstanceLink(_XComLink):
    name = "EC2 instance"
    key = "spot_ec2_instance_link"

    @staticmethod
    def url_for(region: str, instance_id: str) -> str:
        return (
            f"https://console.aws.amazon.com/ec2/home?region={region}"
            f"#InstanceDetails:instanceId={instance_id}"
        )
