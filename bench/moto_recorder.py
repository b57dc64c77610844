"""moto in server mode for the scale benchmarks, counting API calls at the server.

``bench/scale.py`` (SpotJobTriggers in one event loop) and ``bench/scale_prefect.py`` (a
real Prefect spot worker) both count what the provider sends to EC2 the same way: moto's
own request recording (``MOTO_RECORDER_FILEPATH``, one JSON line per request), read back
and named by EC2 action or S3 method, on a network made the same way.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs

from bench.aws import start_moto

REGION, ZONE, INSTANCE_TYPE = "us-east-1", "us-east-1a", "g5.xlarge"


@contextmanager
def recording_moto(work: Path) -> Iterator[tuple[str, Path]]:
    """A moto server that records every request into ``work`` once told to
    (``start_recording``), with throwaway credentials in this process and its children;
    (endpoint, recording path). Stopped however the block ends."""
    work.mkdir(parents=True, exist_ok=True)
    recording = work / "moto-recording.jsonl"
    os.environ.update({"MOTO_RECORDER_FILEPATH": str(recording), "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": REGION,
                       "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                       "AWS_CONFIG_FILE": "/dev/null"})
    proc, endpoint = start_moto()
    try:
        yield endpoint, recording
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - still running: kill it
            proc.kill()
            proc.wait(timeout=10)


def make_network(endpoint: str, bucket: str) -> dict:
    """A subnet in ``ZONE``, an AMI and a checkpoint bucket in moto."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18",
                               AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    boto3.client("s3", region_name=REGION, endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return {"subnet": subnet, "image_id": image, "bucket": bucket}


def start_recording(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(
        f"{endpoint}/moto-api/recorder/start-recording", method="POST"), timeout=10).read()


def recorded(recording: Path) -> list[dict]:
    """moto's recorded requests so far (whole lines only)."""
    if not recording.exists():
        return []
    entries = []
    for line in recording.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            break  # a line moto is still writing
    return entries


def request_name(entry: dict) -> tuple[str, dict]:
    """(the EC2 action, or "S3 METHOD" / "other METHOD"; the query of an EC2 request)."""
    body = entry.get("body") or ""
    if entry.get("body_encoded"):
        body = base64.b64decode(body).decode(errors="replace")
    query = parse_qs(body) if "Action=" in body else {}
    if query:
        return query["Action"][0], query
    auth = (entry.get("headers") or {}).get("Authorization", "")
    return f"{'S3' if '/s3/' in auth else 'other'} {entry.get('method')}", query
