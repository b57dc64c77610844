"""moto in server mode for the scale benchmarks, counting API calls at the server.

``bench/scale.py`` (SpotJobTriggers in one event loop), ``bench/scale_triggerer.py`` (a
real ``airflow triggerer``) and ``bench/scale_prefect.py`` (a real Prefect spot worker)
count what the provider sends to EC2 the same way: moto's own request recording
(``MOTO_RECORDER_FILEPATH``, one JSON line per request), read back and named by EC2
action or S3 method, on a network made the same way; and each terminates, at the end,
whatever instance the process it measured left running.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs

from bench.processes import measure_window
from spot_emulators.moto_server import running_moto

REGION, ZONE, INSTANCE_TYPE = "us-east-1", "us-east-1a", "g5.xlarge"
HEARTBEAT_KEY = "/heartbeat/driver.json"  # spot_core.checkpoint.heartbeat's object


@contextmanager
def recording_moto(work: Path) -> Iterator[tuple[str, Path]]:
    """A moto server that records every request into ``work`` once told to
    (``start_recording``), with throwaway credentials in this process and its children;
    (endpoint, recording path). Stopped however the block ends."""
    work.mkdir(parents=True, exist_ok=True)
    recording = work / "moto-recording.jsonl"
    os.environ.update(
        {
            "MOTO_RECORDER_FILEPATH": str(recording),
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_CONFIG_FILE": "/dev/null",
        }
    )
    with running_moto() as endpoint:
        yield endpoint, recording


def make_network(endpoint: str, bucket: str) -> dict:
    """A subnet in ``ZONE``, an AMI and a checkpoint bucket in moto."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18", AvailabilityZone=ZONE)["Subnet"][
        "SubnetId"
    ]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    boto3.client("s3", region_name=REGION, endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return {"subnet": subnet, "image_id": image, "bucket": bucket}


def start_recording(endpoint: str) -> None:
    urllib.request.urlopen(
        urllib.request.Request(f"{endpoint}/moto-api/recorder/start-recording", method="POST"),
        timeout=10,
    ).read()


def recorded(recording: Path) -> list[dict]:
    """moto's recorded requests so far. moto writes each entry and its newline in two
    writes from its request threads, so two entries can share a line (and the last line
    can be one still being written): every whole JSON object is read, wherever it is."""
    if not recording.exists():
        return []
    text = recording.read_text()
    whole = text[: text.rfind("\n") + 1]  # not a last line still being written
    decoder, entries, at = json.JSONDecoder(), [], 0
    while True:
        at = _skip_space(whole, at)
        if at >= len(whole):
            return entries
        try:
            entry, at = decoder.raw_decode(whole, at)
            entries.append(entry)
        except ValueError:  # a torn entry: skip to the next line
            at = whole.find("\n", at) + 1 or len(whole)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \n\r\t":
        at += 1
    return at


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


def classify(entries: list[dict]) -> dict:
    """Requests by EC2 action or S3 method; describe rounds (polls), the instance ids they
    named, the driver-heartbeat PUTs (S3 PUTs of ``<store>/heartbeat/driver.json``), how
    many distinct jobs they renewed (or pointed at a driver's beat), and the PUTs of the
    watching processes' own beats (``.../drivers/<id>.json``, with ``heartbeat_uri``).

    A round names every watched id once, in one call or in batches (500 ids per call), and
    moto pages an answer by 100 reservations: so a first page (no NextToken) that names an
    id the current round already named starts the next round (as does a listing, which
    names none); later pages are not counted as calls of a new round."""
    calls: dict[str, int] = {}
    polls = ids = 0
    round_ids: set[str] | None = None
    beating: set[str] = set()
    beats = driver_beats = 0
    for entry in entries:
        name, query = request_name(entry)
        calls[name] = calls.get(name, 0) + 1
        if name == "DescribeInstances" and "NextToken" not in query:
            named = {v[0] for key, v in query.items() if key.startswith("InstanceId.")}
            if round_ids is None or not named or named & round_ids:
                polls, round_ids = polls + 1, set()
            round_ids |= named
            ids += len(named)
        elif name == "S3 PUT" and HEARTBEAT_KEY in entry.get("url", ""):
            beating.add(entry["url"].split("?")[0])
            beats += 1
        elif name == "S3 PUT" and "/drivers/" in entry.get("url", ""):
            driver_beats += 1
    return {
        "calls": calls,
        "polls": polls,
        "ids_described": ids,
        "heartbeat_puts": beats,
        "jobs_renewed": len(beating),
        "driver_beat_puts": driver_beats,
    }


def measure_watching(pid: int, recording: Path, seconds: float, jobs: int) -> dict:
    """``seconds`` of a process watching ``jobs`` leases on this moto: the requests moto
    got (EC2 calls per poll; the jobs' S3 heartbeats apart) and the process tree's CPU."""
    first, _, figures = measure_window(pid, seconds, jobs, lambda: len(recorded(recording)))
    counted = classify(recorded(recording)[first:])
    polls = max(counted["polls"], 1)
    ec2 = {k: v for k, v in counted["calls"].items() if not k.startswith(("S3 ", "other "))}
    describes = {k: v for k, v in ec2.items() if k.startswith("Describe")}
    return {
        "window_s": figures["window_s"],
        "polls": counted["polls"],
        "ids_described_per_poll": round(counted["ids_described"] / polls, 1),
        "server_calls": counted["calls"],
        "ec2_describe_calls_per_poll": round(sum(describes.values()) / polls, 2),
        "ec2_calls_per_poll": round(sum(ec2.values()) / polls, 2),
        "heartbeat_puts_in_window": counted["heartbeat_puts"],
        "jobs_renewed_in_window": counted["jobs_renewed"],
        "driver_beat_puts_in_window": counted["driver_beat_puts"],
        **figures,
    }


def ec2_client(endpoint: str):
    import boto3

    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


def live_instances(endpoint: str) -> list[str]:
    """Every pending/running instance the project tagged."""
    pages = (
        ec2_client(endpoint)
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": "tag:spot-pipelines:managed", "Values": ["true"]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
    )
    return [i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]]


def terminate_leftovers(endpoint: str, report: dict) -> None:
    """After the measured process stopped: terminate what it left running, say how many."""
    left = live_instances(endpoint)
    report["instances_left_by_process"] = len(left)
    ec2 = ec2_client(endpoint)
    for start in range(0, len(left), 500):
        ec2.terminate_instances(InstanceIds=left[start : start + 500])
    report["instances_live_at_end"] = len(live_instances(endpoint))
