"""Time to resume after a reclaim, handover off against on_notice (and, on EC2,
on_rebalance): ``make bench-resume``.

One job per provider and mode, side by side in one run, each reclaimed once after its
first checkpoint, driven by ``Controller.run`` as ``spot-pipelines run`` drives it:

* the local cloud at time scale 1 (a 10 s tick trace: zone a reclaimed at 20 s with
  AWS's two-minute notice, zone b up from then);
* EC2 through moto and the instance runtime emulator: a 20 s notice, 5 s from an
  instance appearing in the API to its user-data starting, checkpoints in S3 (moto); with
  ``on_rebalance`` a rebalance recommendation (IMDS and EventBridge) comes
  ``REBALANCE_LEAD_SECONDS`` before the notice, as AWS often sends it;
* the Kubernetes emulator: a Karpenter spot node reclaimed (taint, then the machine
  lost), the replacement on the on-demand pool; cluster time scale 1.

The step (``bench.resume_step``) keeps a payload of several MiB over several files and
saves every few steps and on the notice. For each run: time to resume (the previous
attempt's notice to the replacement's first step, ``JobRecord.time_to_resume_seconds``),
the restore share (the step's own restore time, from its resume report), when the
replacement was launched and when the old lease ended (both from the notice).

Then restore time per GiB: ``CheckpointStore.load`` (files one after another) against
``load_concurrently`` (files at once, digests checked as they stream), on a file store
and on S3 (moto).

Writes bench/tables/resume.md and prints one JSON object. Not a test: nothing is timed
in ``make test``; numbers from this shared, noisy machine are for the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from spot_core.checkpoint import open_store
from spot_core.checkpoint.resumed import read_resumed
from spot_core.controller import Controller, JobSpec
from spot_core.model import JobRecord
from spot_core.policy.retry import RetryPolicy

MiB = 1 << 20
TABLES = Path(__file__).with_name("tables")
MODES = ("off", "on_notice")
EC2_MODES = (*MODES, "on_rebalance")
ORDER = EC2_MODES
STEP_SECONDS = 0.05
REBALANCE_LEAD_SECONDS = 10.0  # the rebalance recommendation, before the notice
AIM_OVER_RESTORE_SECONDS = 2.0  # the aim: at most the restore time + 2 s


def step_command(steps: int, payload_mib: int, files: int, every: int) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "bench.resume_step",
        str(steps),
        str(STEP_SECONDS),
        str(payload_mib),
        str(files),
        str(every),
    )


def summarize(env: str, mode: str, record: JobRecord, uri: str, notice_s: float) -> dict:
    """One run's row: what the record and the replacement's resume report say."""
    row: dict[str, Any] = {"provider": env, "handover": mode, "status": str(record.status)}
    launched = [a for a in record.attempts if a.lease_id]
    if len(launched) < 2 or not record.time_to_resume_seconds:
        row["error"] = "no resumed attempt: " + "; ".join(a.message for a in record.attempts)
        return row
    old, new = launched[0], launched[1]
    notice = old.notice_at if old.notice_at is not None else old.ended_at or 0.0
    report = read_resumed(open_store(uri), new.number)
    ttr = record.time_to_resume_seconds[0]
    restore = None if report is None else report.restore_seconds
    row.update(
        time_to_resume_seconds=round(ttr, 2),
        restore_seconds=None if restore is None else round(restore, 3),
        restore_share=None if restore is None or ttr <= 0 else round(restore / ttr, 3),
        replacement_launched_after_notice_seconds=round(new.started_at - notice, 2),
        old_lease_ended_after_notice_seconds=round((old.ended_at or notice) - notice, 2),
        resumed_from_step=new.checkpoint_step_start,
        notice_window_seconds=notice_s,
        below_notice_window=ttr < notice_s,
        within_restore_plus_2s=restore is not None and ttr <= restore + AIM_OVER_RESTORE_SECONDS,
    )
    return row


# -- the local cloud --------------------------------------------------------------------------
def run_local(workdir: Path, mode: str) -> dict:
    from spot_core.localcloud.server import LocalCloudServer
    from spot_core.market.trace import ZoneTrace
    from spot_core.providers import open_provider

    def zone(name: str, pattern: str) -> ZoneTrace:
        available = np.array([c == "1" for c in pattern], dtype=bool)
        return ZoneTrace(name, 10.0, available, np.full(available.size, 0.9), 3.06, None, "bench")

    traces = [
        zone("us-east-1a_v100_1", "11" + "0" * 300),
        zone("us-east-1b_v100_1", "00" + "1" * 300),
    ]
    with LocalCloudServer.from_traces(traces, time_scale=1.0, workdir=workdir / "cloud") as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        uri = (workdir / "ckpt").as_uri()
        spec = JobSpec("bench-local", step_command(600, 64, 8, 40), uri, provider.pools())
        record = _controller(provider, mode, poll=0.2).run(spec)
    return summarize("local (scale 1)", mode, record, uri, 120.0)


# -- EC2 (moto + the instance runtime emulator) -----------------------------------------------
def run_ec2(workdir: Path, mode: str, endpoint: str, network: dict) -> dict:
    import boto3

    from spot_core.providers.ec2 import Ec2Provider
    from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env

    sqs = boto3.client("sqs", region_name="us-east-1", endpoint_url=endpoint)
    queue = sqs.create_queue(QueueName=f"bench-resume-{mode}-{os.getpid()}")["QueueUrl"]
    uri = f"s3://bench-resume/{mode}-{os.getpid()}"
    runtime = Ec2InstanceRuntime(
        endpoint,
        workdir / "runtime",
        ("us-east-1",),
        default_instance_env(endpoint, "us-east-1"),
        notice_seconds=20.0,
        launch_latency_seconds=5.0,
        sqs_queue_url=queue,
    )
    provider = Ec2Provider.from_options(
        region="us-east-1",
        endpoint_url=endpoint,
        subnets=network["subnets"],
        instance_types=["g4dn.xlarge", "g5.xlarge"],
        image_id=network["image_id"],
        instance_profile=network["instance_profile"],
        agent_python=sys.executable,
        watch_poll_interval=0.1,
        sqs_queue_url=queue,
    )
    lead = REBALANCE_LEAD_SECONDS if mode == "on_rebalance" else None
    with provider, runtime:
        spec = JobSpec(
            f"bench-ec2-{mode}", step_command(500, 32, 4, 40), uri, tuple(provider.pools())
        )
        with _reclaim_after_first_checkpoint(uri, lambda: _ec2_victim(runtime, lead)):
            record = _controller(provider, mode, poll=0.5).run(spec)
        row = summarize("EC2 (moto, 20 s notice, 5 s launch)", mode, record, uri, 20.0)
        row.update(_ec2_breakdown(runtime, record, uri))
    if lead is not None:
        row["rebalance_lead_seconds"] = lead
    return row


def _ec2_breakdown(runtime: Any, record: JobRecord, uri: str) -> dict:
    """Where the time to resume went, on the emulator's clock: the notice as served (not
    as recorded), the replacement's launch and its user-data's start (after the emulated
    launch latency), and its first step (boot, wait and restore)."""
    launched = [a for a in record.attempts if a.lease_id]
    report = None if len(launched) < 2 else read_resumed(open_store(uri), launched[1].number)
    if report is None:
        return {}
    old, new = (runtime.instances.get(a.lease_id) for a in launched[:2])
    if old is None or new is None or old.notice_at is None:
        return {}
    served = old.notice_at
    return {
        "served_notice_to_resume_seconds": round(report.resumed_at - served, 2),
        "launched_after_served_notice_seconds": round(launched[1].started_at - served, 2),
        "user_data_started_after_notice_seconds": round(new.started_at - served, 2),
        "user_data_to_first_step_seconds": round(report.resumed_at - new.started_at, 2),
    }


def _ec2_victim(runtime: Any, rebalance_lead: float | None) -> Callable[[], None] | None:
    """Reclaims the running spot instance: its notice, after a rebalance recommendation
    ``rebalance_lead`` seconds earlier when given."""
    with runtime._lock:
        running = [
            i
            for i in runtime.instances.values()
            if i.spot and i.notice_at is None and i.process.poll() is None
        ]
    if not running:
        return None
    instance_id = running[0].instance_id

    def reclaim() -> None:
        if rebalance_lead is not None:
            runtime.recommend_rebalance(instance_id)
            time.sleep(rebalance_lead)
        runtime.preempt(instance_id)

    return reclaim


# -- Kubernetes (the emulator) ----------------------------------------------------------------
def run_kubernetes(workdir: Path, mode: str) -> dict:
    from spot_core.providers.kubernetes import KubernetesProvider
    from spot_emulators.kubernetes.cluster import KubeCluster
    from spot_emulators.kubernetes.config import ClusterConfig
    from spot_emulators.kubernetes.pools import NodePool

    pools = [
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None),
        NodePool("karpenter-od", "karpenter", "on-demand", "us-east-1b"),
    ]
    with KubeCluster(workdir / "cluster", ClusterConfig(pools=pools, time_scale=1.0)) as cluster:
        provider = KubernetesProvider.from_options(
            kubeconfig=str(cluster.kubeconfig_path),
            image="step:1",
            watch_command=[sys.executable, "-m", "spot_core.cli"],
            watch_poll_interval=0.2,
            node_refresh_seconds=0.2,
            prices={"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}},
        )
        uri = (workdir / "ckpt").as_uri()
        spec = JobSpec("bench-k8s", step_command(500, 64, 8, 40), uri, provider.pools())

        def victim() -> Callable[[], None] | None:
            nodes = [
                pod["spec"].get("nodeName")
                for pod in _pods(provider)
                if pod["status"].get("phase") == "Running"
            ]
            nodes = [n for n in nodes if n and "spot" in n]
            return None if not nodes else (lambda: cluster.reclaim(nodes[0]))

        with _reclaim_after_first_checkpoint(uri, victim):
            record = _controller(provider, mode, poll=0.2, max_preemptions=1).run(spec)
        provider.close()
    return summarize("Kubernetes (emulator, Karpenter)", mode, record, uri, 5.0)


def _pods(provider: Any) -> list[dict]:
    from spot_core.adaptors import kubernetes as k8s
    from spot_core.providers import kubernetes_pods as pods

    listed = k8s.raw(
        "list pods", provider.api.list_namespaced_pod, "default", label_selector=pods.job_selector()
    )
    return listed.get("items") or []


# -- shared -----------------------------------------------------------------------------------
def _controller(provider: Any, mode: str, *, poll: float, max_preemptions: int = 3) -> Controller:
    policy = RetryPolicy(
        max_preemptions=max_preemptions, capacity_wait_seconds=1.0, on_demand_fallback=True
    )
    return Controller(
        provider,
        provider.market,
        policy,
        poll_interval_seconds=poll,
        heartbeat_timeout_seconds=60.0,
        handover=mode,
    )


@contextlib.contextmanager
def _reclaim_after_first_checkpoint(
    uri: str, victim: Callable[[], Callable[[], None] | None], timeout: float = 120.0
) -> Iterator[None]:
    """A thread that reclaims the job's capacity once attempt 1 committed a checkpoint."""
    import threading

    done = threading.Event()

    def run() -> None:
        store = open_store(uri)
        give_up = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < give_up:
            try:
                committed = any(r.attempt == 1 for r in store.list())
            except Exception:  # noqa: BLE001 - the store may not exist yet
                committed = False
            reclaim = victim() if committed else None
            if reclaim is not None:
                time.sleep(1.0)  # a little work past the checkpoint
                reclaim()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, name="reclaimer", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


def restore_per_gib(workdir: Path, endpoint: str | None) -> list[dict]:
    """Seconds per GiB to read a checkpoint of 8 files: one after another, and at once."""
    rows = []
    cases = [("file", (workdir / "restore").as_uri(), 512)]
    if endpoint is not None:
        cases.append(("s3 (moto)", f"s3://bench-resume/restore-{os.getpid()}", 128))
    for name, uri, mib in cases:
        store = open_store(uri)
        size = mib * MiB // 8
        ref = store.save(1, {f"shard-{i}.bin": os.urandom(size) for i in range(8)})
        timings = {}
        for how in ("load", "load_concurrently"):
            best = float("inf")
            for _ in range(3):
                fresh = open_store(uri)  # nothing cached
                started = time.perf_counter()
                getattr(fresh, how)(ref)
                best = min(best, time.perf_counter() - started)
            timings[how] = best * 1024 / mib
        rows.append(
            {
                "store": name,
                "payload_mib": mib,
                "sequential_s_per_gib": round(timings["load"], 2),
                "concurrent_s_per_gib": round(timings["load_concurrently"], 2),
                "speedup": round(timings["load"] / timings["load_concurrently"], 2),
            }
        )
    return rows


def table(rows: list[dict], restores: list[dict]) -> str:
    lines = [
        "| provider | handover | time to resume s | restore s (share) | "
        "replacement launched s | old lease ended s | below notice window | "
        "<= restore + 2 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['provider']} | {r['handover']} | {r['error'][:80]} | | | | | |")
            continue
        share = "-" if r["restore_share"] is None else f"{r['restore_share']:.0%}"
        mode = r["handover"]
        if "rebalance_lead_seconds" in r:
            mode += f" ({r['rebalance_lead_seconds']:g} s lead)"
        lines.append(
            f"| {r['provider']} | {mode} | {r['time_to_resume_seconds']:.2f} | "
            f"{r['restore_seconds']:.2f} ({share}) | "
            f"{r['replacement_launched_after_notice_seconds']:+.2f} | "
            f"{r['old_lease_ended_after_notice_seconds']:+.2f} | "
            f"{'yes' if r['below_notice_window'] else 'no'} "
            f"({r['notice_window_seconds']:g} s) | "
            f"{'yes' if r['within_restore_plus_2s'] else 'no'} |"
        )
    lines += _breakdown_table(rows)
    lines += [
        "",
        "| store | payload MiB | load s/GiB | load_concurrently s/GiB | speedup |",
        "|---|---|---|---|---|",
    ]
    for r in restores:
        lines.append(
            f"| {r['store']} | {r['payload_mib']} | {r['sequential_s_per_gib']} | "
            f"{r['concurrent_s_per_gib']} | {r['speedup']}x |"
        )
    return "\n".join(lines) + "\n"


def _breakdown_table(rows: list[dict]) -> list[str]:
    """The EC2 rows' time to resume split at the emulator's own instants."""
    split = [r for r in rows if "served_notice_to_resume_seconds" in r]
    if not split:
        return []
    lines = [
        "",
        "| EC2 handover | launched s | user-data started s | user-data start to first "
        "step s | restore s | time to resume from the served notice s |",
        "|---|---|---|---|---|---|",
    ]
    for r in split:
        lines.append(
            f"| {r['handover']} | {r['launched_after_served_notice_seconds']:+.2f} | "
            f"{r['user_data_started_after_notice_seconds']:+.2f} | "
            f"{r['user_data_to_first_step_seconds']:.2f} | {r['restore_seconds']:.2f} | "
            f"{r['served_notice_to_resume_seconds']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__)
    parser.add_argument("--only", choices=("local", "ec2", "kubernetes"), action="append")
    args = parser.parse_args(argv)
    only = set(args.only or ("local", "ec2", "kubernetes"))
    rows: list[dict] = []
    restores: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as scratch:
        work = Path(scratch)
        for mode in MODES:
            if "local" in only:
                rows.append(run_local(work / f"local-{mode}", mode))
                print(json.dumps(rows[-1]), flush=True)
            if "kubernetes" in only:
                rows.append(run_kubernetes(work / f"k8s-{mode}", mode))
                print(json.dumps(rows[-1]), flush=True)
        endpoint = None
        with contextlib.ExitStack() as stack:
            if "ec2" in only:
                endpoint = _moto(stack)
                network = _network(endpoint)
                for mode in EC2_MODES:
                    rows.append(run_ec2(work / f"ec2-{mode}", mode, endpoint, network))
                    print(json.dumps(rows[-1]), flush=True)
            restores = restore_per_gib(work, endpoint)
    rows.sort(key=lambda r: (r["provider"], ORDER.index(r["handover"])))
    TABLES.mkdir(exist_ok=True)
    (TABLES / "resume.md").write_text(table(rows, restores))
    print(json.dumps({"runs": rows, "restore_per_gib": restores}))
    return 0


def _moto(stack: contextlib.ExitStack) -> str:
    from spot_emulators.moto_server import moto_s3_bucket

    return stack.enter_context(moto_s3_bucket("bench-resume"))


def _network(endpoint: str) -> dict:
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(
            VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=f"us-east-1{'ab'[i]}"
        )["Subnet"]["SubnetId"]
        for i in range(2)
    ]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=endpoint)
    iam.create_instance_profile(InstanceProfileName="spot-pipelines-step")
    return {"subnets": subnets, "image_id": image, "instance_profile": "spot-pipelines-step"}


if __name__ == "__main__":
    sys.exit(main())
