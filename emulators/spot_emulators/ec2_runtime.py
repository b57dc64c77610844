"""The instance runtime: what EC2 does *inside* an instance, for an EC2 API emulator (moto).

moto answers the EC2 API faithfully but runs nothing. This harness watches it and, for
every instance tagged ``spot-pipelines:managed=true`` that moto reports running, does
what the instance would do: it runs the instance's user-data as a local process (bash),
with its own IMDSv2 emulator (``SPOT_METADATA_ENDPOINT``) and with the credentials and
endpoints that the instance profile and VPC would provide (``instance_env``).

It then keeps the two worlds consistent:
- the user-data process ends by itself (the step finished and the script "powered off")
  -> the instance is terminated in moto, as ``InstanceInitiatedShutdownBehavior=terminate``
  would;
- the instance is terminated in moto (by the controller, a person, orphan cleanup) -> its
  processes get SIGTERM, then SIGKILL after ``grace_seconds``;
- ``preempt(instance_id)`` is a spot reclaim: the emulator serves the interruption notice
  (and, if a queue is configured, the EventBridge "EC2 Spot Instance Interruption Warning"
  goes to SQS), and after ``notice_seconds`` the instance is terminated in moto and its
  processes killed. ``preempt_spot_after`` does that automatically to the first
  ``max_auto_preemptions`` spot instances once they have run that long;
- ``recommend_rebalance(instance_id)`` is EC2 seeing the instance at elevated risk: the
  emulator serves ``events/recommendations/rebalance`` and the EventBridge "EC2 Instance
  Rebalance Recommendation" goes to SQS. Nothing is reclaimed by it: AWS may send the
  notice later (``preempt``), with it, or never.

Run it beside ``spot-pipelines run --provider ec2 --endpoint-url URL``::

    python -m spot_emulators.ec2_runtime --endpoint-url URL --preempt-spot-after 5 \\
        --max-preemptions 2
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spot_core.attempt_env import METADATA_ENDPOINT
from spot_core.localcloud.lease_processes import LEASE_MARKER, lease_pids, signal_lease
from spot_core.localcloud.metadata import MetadataEmulator

log = logging.getLogger(__name__)

MANAGED_FILTER = {"Name": "tag:spot-pipelines:managed", "Values": ["true"]}


@dataclass
class RuntimeInstance:
    instance_id: str
    region: str
    zone: str
    instance_type: str
    spot: bool
    process: subprocess.Popen[bytes]
    emulator: MetadataEmulator
    log_path: Path
    started_at: float
    notice_at: float | None = None
    rebalance_at: float | None = None
    reclaim_at: float | None = None
    kill_at: float | None = None
    exit_code: int | None = None
    done: bool = False


@dataclass
class Ec2InstanceRuntime:
    endpoint_url: str
    workdir: Path
    regions: Sequence[str] = ("us-east-1",)
    instance_env: Mapping[str, str] = field(default_factory=dict)
    poll_interval: float = 0.1
    grace_seconds: float = 2.0
    notice_seconds: float = 2.0
    preempt_spot_after: float | None = None
    max_auto_preemptions: int = 0
    sqs_queue_url: str | None = None
    # Seconds from an instance appearing in the API to its user-data starting: what EC2
    # takes to place and boot a machine (the handover benchmark uses 5 s).
    launch_latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        import boto3

        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._clients = {
            r: boto3.client("ec2", region_name=r, endpoint_url=self.endpoint_url)
            for r in self.regions
        }
        self._sqs = None
        if self.sqs_queue_url:
            self._sqs = boto3.client(
                "sqs", region_name=self.regions[0], endpoint_url=self.endpoint_url
            )
        self.instances: dict[str, RuntimeInstance] = {}
        self.preempted: list[str] = []
        self._first_seen: dict[str, float] = {}  # instance id -> when it appeared, not booted
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> Ec2InstanceRuntime:
        self._thread = threading.Thread(target=self._run, name="ec2-instance-runtime", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and kill every process this runtime started (moto is left as is)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for instance in self.instances.values():
                self._kill(instance, signal.SIGKILL)
                instance.emulator.stop()
        give_up = time.monotonic() + 5.0  # SIGKILLed processes take a moment to go
        while self.live_pids() and time.monotonic() < give_up:
            time.sleep(0.05)

    def __enter__(self) -> Ec2InstanceRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control ------------------------------------------------------------------------
    def preempt(self, instance_id: str, notice_seconds: float | None = None) -> None:
        """Reclaim a running instance: notice now, terminate after ``notice_seconds``."""
        with self._lock:
            instance = self.instances[instance_id]
            if instance.notice_at is not None or instance.done:
                return
            wait = self.notice_seconds if notice_seconds is None else notice_seconds
            now = time.time()
            instance.emulator.schedule_interruption(at=now, notice_seconds=wait)
            instance.notice_at, instance.reclaim_at = now, now + wait
            self.preempted.append(instance_id)
        self._send_event(instance, now, "interruption")
        log.info("preempting %s: notice served, reclaim in %.1fs", instance_id, wait)

    def recommend_rebalance(self, instance_id: str) -> None:
        """An EC2 rebalance recommendation for a running instance: IMDS serves its
        ``noticeTime`` from now on and, with a queue, the EventBridge event is sent. Once
        per instance, as EC2 does; no reclaim follows unless ``preempt`` is called."""
        with self._lock:
            instance = self.instances[instance_id]
            if instance.rebalance_at is not None or instance.done:
                return
            now = time.time()
            instance.emulator.schedule_rebalance(at=now)
            instance.rebalance_at = now
        self._send_event(instance, now, "rebalance")
        log.info("rebalance recommendation for %s", instance_id)

    def wait_for(
        self, predicate: Callable[[Ec2InstanceRuntime], object], timeout: float = 30.0
    ) -> bool:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            with self._lock:
                if predicate(self):
                    return True
            time.sleep(0.05)
        with self._lock:
            return bool(predicate(self))

    def live_pids(self) -> list[int]:
        with self._lock:
            return [pid for i in self.instances for pid in lease_pids(i)]

    # -- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self._round()
            except Exception:  # the runtime must outlive one bad round (moto restarting...)
                log.exception("instance runtime round failed")

    def _round(self) -> None:
        now = time.time()
        for region, client in self._clients.items():
            for described in self._describe(client):
                self._sync(region, client, described, now)
        with self._lock:
            for instance in self.instances.values():
                self._advance(instance, now)

    def _describe(self, client: Any) -> list[dict[str, Any]]:
        pages = client.get_paginator("describe_instances").paginate(Filters=[MANAGED_FILTER])
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _sync(self, region: str, client: Any, described: Mapping[str, Any], now: float) -> None:
        instance_id, state = described["InstanceId"], described["State"]["Name"]
        with self._lock:
            instance = self.instances.get(instance_id)
        if instance is None:
            if state not in ("pending", "running"):
                self._first_seen.pop(instance_id, None)
            elif now - self._first_seen.setdefault(instance_id, now) >= self.launch_latency_seconds:
                self._first_seen.pop(instance_id, None)
                self._boot(region, client, described, now)
            return
        if state not in ("pending", "running") and not instance.done and instance.kill_at is None:
            # Terminated in the API: the machine goes away with everything on it.
            self._kill(instance, signal.SIGTERM)
            instance.kill_at = now + self.grace_seconds

    def _advance(self, instance: RuntimeInstance, now: float) -> None:
        if instance.exit_code is None and instance.process.poll() is not None:
            instance.exit_code = instance.process.returncode
            if instance.reclaim_at is None and instance.kill_at is None:
                self._terminate_in_api(instance)  # the script powered the instance off
                instance.done = True
        if (
            instance.reclaim_at is not None
            and now >= instance.reclaim_at
            and instance.kill_at is None
        ):
            self._terminate_in_api(instance)
            self._kill(instance, signal.SIGTERM)
            instance.kill_at = now + self.grace_seconds
        if instance.kill_at is not None and now >= instance.kill_at and not instance.done:
            self._kill(instance, signal.SIGKILL)
            instance.emulator.stop()
            instance.done = True
        if (
            self.preempt_spot_after is not None
            and instance.spot
            and instance.notice_at is None
            and not instance.done
            and instance.kill_at is None
            and len(self.preempted) < self.max_auto_preemptions
            and now - instance.started_at >= self.preempt_spot_after
        ):
            self.preempt(instance.instance_id)

    def _boot(self, region: str, client: Any, described: Mapping[str, Any], now: float) -> None:
        instance_id = described["InstanceId"]
        answer = client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        encoded = (answer.get("UserData") or {}).get("Value") or ""
        script = base64.b64decode(encoded).decode() if encoded else "#!/bin/bash\nexit 0\n"
        script_path = self.workdir / f"{instance_id}.user-data.sh"
        script_path.write_text(script)
        zone = described.get("Placement", {}).get("AvailabilityZone", f"{region}a")
        emulator = MetadataEmulator(
            clouds=("aws",),
            zone=zone,
            instance_id=instance_id,
            instance_type=described.get("InstanceType", "m5.large"),
        )
        emulator.start()
        log_path = self.workdir / f"{instance_id}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOT_")}
        env.update(self.instance_env)
        env.update(
            {
                METADATA_ENDPOINT: emulator.url,
                LEASE_MARKER: instance_id,
                "SPOT_WATCH_LOG": str(self.workdir / f"{instance_id}.watch.log"),
                "SPOT_BOOTSTRAP_LOG": str(self.workdir / f"{instance_id}.bootstrap.log"),
                "SPOT_SHUTDOWN_COMMAND": "true",
            }
        )
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                ["bash", str(script_path)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.workdir,
            )
        spot = described.get("InstanceLifecycle") == "spot" or bool(
            described.get("SpotInstanceRequestId")
        )
        instance = RuntimeInstance(
            instance_id,
            region,
            zone,
            described.get("InstanceType", ""),
            spot,
            process,
            emulator,
            log_path,
            now,
        )
        with self._lock:
            self.instances[instance_id] = instance
        log.info("booted %s (%s, %s)", instance_id, zone, "spot" if spot else "on-demand")

    def _terminate_in_api(self, instance: RuntimeInstance) -> None:
        try:
            self._clients[instance.region].terminate_instances(InstanceIds=[instance.instance_id])
        except Exception as exc:  # noqa: BLE001 - logged; the emulator goes on
            log.warning("could not terminate %s in the API: %s", instance.instance_id, exc)

    def _kill(self, instance: RuntimeInstance, signum: int) -> None:
        own = (instance.process.pid,) if instance.process.poll() is None else ()
        signal_lease(instance.instance_id, signum, extra_pids=own)

    def _send_event(self, instance: RuntimeInstance, at: float, kind: str) -> None:
        """The EventBridge event of ``kind`` (``interruption``, ``rebalance``) to the queue."""
        if self._sqs is None:
            return
        from spot_core.interruption.eventbridge import interruption_event

        body = json.dumps(interruption_event(instance.instance_id, at, instance.region, kind))
        try:
            self._sqs.send_message(QueueUrl=self.sqs_queue_url, MessageBody=body)
        except Exception as exc:  # noqa: BLE001 - logged; the emulator goes on
            log.warning("could not send the %s event of %s: %s", kind, instance.instance_id, exc)


def default_instance_env(endpoint_url: str, region: str) -> dict[str, str]:
    """What the instance profile and the VPC give a real instance, for an emulator: throwaway
    credentials (what IMDS would serve), the region, the S3 endpoint, and this Python's
    ``bin`` on PATH (the AMI would have spot-pipelines installed)."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        "AWS_DEFAULT_REGION": region,
        "SPOT_S3_ENDPOINT_URL": endpoint_url,
        "SPOT_EC2_ENDPOINT_URL": endpoint_url,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spot_emulators.ec2_runtime", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--region", action="append", default=None)
    parser.add_argument("--workdir", default=".spot-ec2-runtime")
    parser.add_argument("--preempt-spot-after", type=float, default=None)
    parser.add_argument("--max-preemptions", type=int, default=0)
    parser.add_argument("--notice-seconds", type=float, default=2.0)
    parser.add_argument("--sqs-queue-url", default=None)
    args = parser.parse_args(argv)
    regions = args.region or ["us-east-1"]
    runtime = Ec2InstanceRuntime(
        args.endpoint_url,
        Path(args.workdir),
        regions,
        default_instance_env(args.endpoint_url, regions[0]),
        notice_seconds=args.notice_seconds,
        preempt_spot_after=args.preempt_spot_after,
        max_auto_preemptions=args.max_preemptions,
        sqs_queue_url=args.sqs_queue_url,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with runtime:
        print(json.dumps({"event": "ready", "endpoint_url": args.endpoint_url}), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(main())
