"""AWS benchmarks against moto in server mode (not timed tests): ``python -m bench.aws``.

1. S3 checkpoint save throughput: ``store.save`` of a 256 MiB payload against a plain
   boto3 ``upload_fileobj`` of the same bytes to the same endpoint (aim: ratio >= 0.8).
   The store also hashes every byte (sha256), writes a manifest and takes its lock, so
   the ratio says what the commit protocol costs on top of the raw upload.
2. EC2 API calls per minute while watching 1,000 leases, counted with a botocore event
   hook on the provider's client (aim: a few calls per poll, not one per lease).
3. What a process pays to open many S3 checkpoint stores (a triggerer or worker opens
   one per watched job): CPU, Python objects, memory and one full garbage collection,
   with the stores sharing one client (``aws.shared_client``, what ``open_store`` does)
   against a client of each store's own (what it did before), each in a fresh process.

moto is an emulator on this machine: absolute MB/s say little about S3; the ratio does.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

from spot_emulators.moto_server import running_moto

MiB = 1 << 20


def bench_s3(endpoint: str, size_mib: int, repeats: int) -> dict:
    import boto3
    from boto3.s3.transfer import TransferConfig

    from spot_core.checkpoint import open_store

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    s3.create_bucket(Bucket="bench")
    data = os.urandom(size_mib * MiB)
    store = open_store("s3://bench/store", endpoint_url=endpoint)
    config = TransferConfig()  # boto3's defaults: 8 MiB parts, 10 threads
    baseline, ours = [], []
    for i in range(repeats):
        started = time.perf_counter()
        s3.upload_fileobj(
            io.BytesIO(data),
            "bench",
            f"plain/{i}.bin",
            ExtraArgs={"ServerSideEncryption": "AES256"},
            Config=config,
        )
        baseline.append(time.perf_counter() - started)
        started = time.perf_counter()
        store.save(i, {"model.bin": data})
        ours.append(time.perf_counter() - started)
        store.prune(keep=1)
        s3.delete_object(Bucket="bench", Key=f"plain/{i}.bin")
    best_base, best_ours = min(baseline), min(ours)
    return {
        "payload_mib": size_mib,
        "repeats": repeats,
        "upload_fileobj_seconds": round(best_base, 3),
        "store_save_seconds": round(best_ours, 3),
        "upload_fileobj_mib_per_s": round(size_mib / best_base, 1),
        "store_save_mib_per_s": round(size_mib / best_ours, 1),
        "throughput_ratio": round(best_base / best_ours, 3),
    }


def bench_watch(endpoint: str, leases: int, polls: int, poll_interval: float) -> dict:
    import boto3

    from spot_core.model import Lease, Pool
    from spot_core.providers.ec2 import Ec2Provider

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone="us-east-1a")[
        "Subnet"
    ]["SubnetId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    provider = Ec2Provider.from_options(
        region="us-east-1",
        endpoint_url=endpoint,
        subnets=[subnet],
        instance_types=["g5.xlarge"],
        image_id=image,
    )
    pool = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge")
    ids: list[str] = []
    while len(ids) < leases:  # launched in bulk: the benchmark is about watching
        batch = min(250, leases - len(ids))
        answer = ec2.run_instances(
            ImageId=image,
            InstanceType="g5.xlarge",
            MinCount=batch,
            MaxCount=batch,
            SubnetId=subnet,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": "spot-pipelines:managed", "Value": "true"}],
                }
            ],
        )
        ids += [i["InstanceId"] for i in answer["Instances"]]
    watched = [
        Lease(
            lease_id=i,
            pool=pool,
            job_id=f"job-{n}",
            attempt=1,
            started_at=time.time(),
            price_per_hour=1.0,
        )
        for n, i in enumerate(ids)
    ]
    counts: dict[str, int] = {}

    def count(model, **kwargs):
        counts[model.name] = counts.get(model.name, 0) + 1

    client = provider.clients["us-east-1"]
    client.meta.events.register("before-call.*.*", count)
    started = time.perf_counter()
    for _ in range(polls):
        statuses = provider.observe(watched)
    elapsed = time.perf_counter() - started
    assert len(statuses) == leases
    observed = dict(counts)  # the observe calls only, not the cleanup below
    calls = sum(observed.values())
    per_poll = calls / polls
    provider.cleanup_orphans()
    return {
        "leases": leases,
        "polls": polls,
        "calls_by_operation": observed,
        "calls_per_poll": per_poll,
        "poll_interval_seconds": poll_interval,
        "calls_per_minute": round(per_poll * 60 / poll_interval, 1),
        "naive_calls_per_minute": round(leases * 60 / poll_interval, 1),
        "seconds_per_poll": round(elapsed / polls, 3),
    }


STORE_VARIANTS = ("shared", "own")


def bench_store_clients(endpoint: str, stores: int) -> dict:
    """Each variant in a fresh interpreter, side by side in one run."""
    results = {}
    for variant in STORE_VARIANTS:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.aws",
                "--open-stores",
                variant,
                "--stores",
                str(stores),
                "--endpoint",
                endpoint,
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
        results[variant] = json.loads(done.stdout)
    own, shared = results["own"], results["shared"]
    results["own_over_shared"] = {
        k: round(own[k] / shared[k], 1)
        for k in ("cpu_ms_per_store", "objects_per_store", "full_gc_ms")
        if shared[k]
    }
    return results


def open_stores(endpoint: str, stores: int, variant: str) -> dict:
    """Open ``stores`` S3 stores in this process and write one object to each; the cost."""
    import gc
    import resource

    from spot_core.adaptors import aws
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.s3_backend import S3Backend

    boto3 = aws.boto3()
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench-stores")
    gc.collect()
    objects, rss = len(gc.get_objects()), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()
    opened = []
    for i in range(stores):
        uri = f"s3://bench-stores/job-{i}"
        if variant == "own":  # as before: a boto3 client (and Session) per store
            client = aws.make_client(
                "s3", endpoint_url=endpoint, max_pool_connections=10, retry_attempts=5
            )
            opened.append(open_store(uri, endpoint_url=endpoint, client=client))
        else:
            opened.append(open_store(uri, endpoint_url=endpoint))
    cpu = time.process_time() - started
    for store in opened:
        store.put_object("heartbeat/driver.json", b"{}")
    gc.collect()
    added = len(gc.get_objects()) - objects
    collect = time.perf_counter()
    gc.collect()
    full_gc = time.perf_counter() - collect
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    assert all(isinstance(s.backend, S3Backend) for s in opened)
    return {
        "variant": variant,
        "stores": stores,
        "clients": len({id(s.backend.client) for s in opened}),
        "cpu_ms_per_store": round(cpu / stores * 1e3, 2),
        "objects_per_store": round(added / stores),
        "max_rss_growth_mib": round(grown),
        "full_gc_ms": round(full_gc * 1e3, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.aws", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="controller poll interval the per-minute figure assumes",
    )
    parser.add_argument(
        "--stores",
        type=int,
        default=200,
        help="S3 stores opened in one process (a client each: ~12 MiB)",
    )
    parser.add_argument(
        "--only",
        choices=("s3", "watch", "stores"),
        action="append",
        help="run only these benchmarks (repeatable; default: all)",
    )
    parser.add_argument("--open-stores", choices=STORE_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.open_stores:  # one variant of bench_store_clients, in its own process
        print(json.dumps(open_stores(args.endpoint, args.stores, args.open_stores)))
        return 0
    only = set(args.only or ("s3", "watch", "stores"))
    report = {}
    with running_moto() as endpoint, tempfile.TemporaryDirectory():
        if "s3" in only:
            report["s3_save"] = bench_s3(endpoint, args.size_mib, args.repeats)
        if "watch" in only:
            report["ec2_watch"] = bench_watch(endpoint, args.leases, args.polls, args.poll_interval)
        if "stores" in only:
            report["store_clients"] = bench_store_clients(endpoint, args.stores)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
