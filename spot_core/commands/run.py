"""`spot-pipelines run`: one job under the controller, from the command line.

Like ``sky jobs launch`` for any command that uses the Checkpointer: the command runs on
spot capacity, is relaunched from its latest checkpoint after each preemption, moves to
on-demand when the preemption budget is spent or spot capacity runs out, and the
JobRecord summary is printed at the end. Every lease is terminated on every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import time
import uuid
from pathlib import Path

from spot_core.errors import ConfigError

PROVIDERS = ("local", "ec2", "kubernetes")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run one command as a spot job under the controller")
    parser.add_argument("--provider", choices=PROVIDERS, default="local")
    parser.add_argument("--pools", default=None, help="comma-separated zones or trace names to "
                        "run in (default: every pool the provider knows)")
    parser.add_argument("--trace", action="append", type=Path, default=None, metavar="PATH",
                        help="local provider: availability trace(s) to replay, one per zone "
                        "(default: the shipped AWS V100 excerpt)")
    parser.add_argument("--prices", type=Path, default=None, help="local provider: per-tick "
                        "spot price file {zone: [...]} for CSV traces")
    parser.add_argument("--time-scale", type=float, default=3600.0, help="local provider: trace "
                        "seconds per wall second (default 3600: one trace hour per second)")
    parser.add_argument("--start-tick", type=int, default=0, help="local provider: trace tick "
                        "to start at (default 0)")
    parser.add_argument("--max-preemptions", type=int, default=3, help="preemptions tolerated "
                        "before the job moves to on-demand (default 3; never a user retry)")
    parser.add_argument("--max-user-retries", type=int, default=0,
                        help="retries when the command itself fails (default 0)")
    parser.add_argument("--max-spot-price", type=float, default=None, metavar="USD_PER_HOUR",
                        help="leave spot pools dearer than this alone: wait (bounded) for a "
                        "cheaper window, then fall back to on-demand")
    parser.add_argument("--no-fallback", action="store_true",
                        help="never use on-demand; wait (bounded) for spot capacity instead")
    parser.add_argument("--deadline", default=None, help="finish by: a duration of capacity "
                        "time such as 90m or 12h, or an ISO time such as 2026-12-01T08:00Z")
    parser.add_argument("--work", default=None, help="with --deadline: compute the job needs "
                        "(a duration such as 10h); the job moves to on-demand when work left "
                        "plus two restarts no longer fits before the deadline on spot")
    parser.add_argument("--total-steps", type=int, default=None, help="with --work: the step "
                        "count at which the job is done, so checkpoint steps measure progress")
    parser.add_argument("--restart-overhead", default=None, metavar="DURATION", help="with "
                        "--work: capacity time a new instance takes before the job makes "
                        "progress again (default 5m), as `simulate --restart-overhead-hours`")
    parser.add_argument("--deadline-policy", default=None, metavar="NAME", help="with --deadline "
                        "and --work: a deadline policy (greedy, uniform-progress, default, ...) "
                        "that decides spot, on-demand or wait between attempts on the local "
                        "cloud's traces, as `spot-pipelines simulate --policy NAME` does "
                        "(default: none, only the on-demand safety net)")
    parser.add_argument("--checkpoint-uri", default=None, help="where the job checkpoints "
                        "(default: file://./.spot-runs/JOB_ID/checkpoints)")
    parser.add_argument("--job-id", default=None, help="job id (default: generated)")
    parser.add_argument("--image", default=None, help="run CMD in this container image "
                        "(Docker on the machine that runs the step, e.g. the EC2 AMI)")
    parser.add_argument("--heartbeat-timeout", default="5m", metavar="DURATION", help="how "
                        "long the running step outlives this command if it dies without "
                        "cleaning up (SIGKILL, a lost machine): the node's watcher saves an "
                        "emergency checkpoint and ends the lease (default 5m)")
    parser.add_argument("--json", action="store_true", help="end with the JobRecord as JSON")
    ec2 = parser.add_argument_group("ec2 provider (see docs/aws.md)")
    ec2.add_argument("--region", default=None, help="ec2: region of the subnets (default: "
                     "$AWS_REGION / $AWS_DEFAULT_REGION)")
    ec2.add_argument("--endpoint-url", default=None, help="ec2: EC2/S3/SQS endpoint (an "
                     "emulator such as moto; default: AWS)")
    ec2.add_argument("--subnets", default=None, help="ec2: comma-separated subnet ids, one "
                     "per availability zone to use")
    ec2.add_argument("--instance-types", default=None, help="ec2: comma-separated instance "
                     "types, e.g. g5.xlarge,g4dn.xlarge")
    ec2.add_argument("--image-id", default=None, help="ec2: AMI with spot-pipelines installed")
    ec2.add_argument("--instance-profile", default=None, help="ec2: IAM instance profile "
                     "(name or ARN) that gives the step access to the checkpoint bucket")
    ec2.add_argument("--ec2-option", action="append", default=[], metavar="KEY=JSON",
                     help="ec2: any other Ec2Provider option, e.g. launch_mode=\"fleet\" "
                     "or security_group_ids='[\"sg-1\"]' (repeatable)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spot_core.controller import Controller, JobSpec
    from spot_core.policy.retry import RetryPolicy
    from spot_core.report import print_record

    deadline_policy = _deadline_policy(args)
    overhead = _overhead(args.restart_overhead)
    command = _command(args.cmd, in_image=args.image is not None)
    job_id = args.job_id or f"job-{uuid.uuid4().hex[:8]}"
    checkpoint_uri = _checkpoint_uri(args.checkpoint_uri, job_id)
    policy = RetryPolicy(max_preemptions=_non_negative("--max-preemptions", args.max_preemptions),
                         max_user_retries=_non_negative("--max-user-retries", args.max_user_retries),
                         on_demand_fallback=not args.no_fallback, capacity_wait_seconds=1.0,
                         max_spot_price=args.max_spot_price,
                         max_capacity_waits=30)
    heartbeat_timeout = _duration("--heartbeat-timeout", args.heartbeat_timeout)
    if not heartbeat_timeout > 0:
        raise ConfigError("--heartbeat-timeout must be longer than 0s, e.g. 5m")
    with _stop_on_signals(), _provider(args) as provider:
        spec = JobSpec(job_id=job_id, command=command, checkpoint_uri=checkpoint_uri,
                       pools=_pools(provider, args.pools),
                       deadline=_deadline(args.deadline, provider),
                       work_seconds=_duration("--work", args.work),
                       total_steps=args.total_steps, image=args.image,
                       deadline_policy=deadline_policy, **overhead)
        controller = Controller(provider, provider.market, policy, listener=_print_event,
                                poll_interval=0.1, heartbeat_timeout=heartbeat_timeout)
        record = controller.run(spec)
    print_record(record, provider.market.time_scale)
    if args.json:
        print(record.to_json(), flush=True)
    return 0 if str(record.status) == "succeeded" else 1


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: stop like Ctrl-C (the controller terminates the running lease)."""


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM and SIGHUP clean up exactly as SIGINT does; the old handlers come back after."""
    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _deadline_policy(args: argparse.Namespace) -> str | None:
    """The --deadline-policy name, checked against the registry before anything starts."""
    if args.deadline_policy is None:
        return None
    from spot_core.policy.deadline_planner import check_deadline_policy

    check_deadline_policy(args.deadline_policy)
    if args.deadline is None or args.work is None:
        raise ConfigError(f"--deadline-policy {args.deadline_policy} needs --deadline and "
                          "--work (and --total-steps, so checkpoints measure progress)")
    return args.deadline_policy


def _overhead(text: str | None) -> dict[str, float]:
    seconds = _duration("--restart-overhead", text)
    return {} if seconds is None else {"restart_overhead_seconds": seconds}


def _print_event(kind: str, record, detail: str) -> None:
    attempt = record.attempts[-1] if record.attempts else None
    where = "" if attempt is None else f"attempt {attempt.number} {attempt.pool.key}"
    print(f"{dt.datetime.now():%H:%M:%S} {kind:<20} {where}  {detail[:100]}", flush=True)


def _command(words: list[str], in_image: bool = False) -> tuple[str, ...]:
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        raise ConfigError("no command to run: put it after --, e.g. "
                          "`spot-pipelines run -- python train.py`")
    if in_image:  # the command lives in the image, not on this machine
        return tuple(command)
    if shutil.which(command[0]) is None and not os.access(command[0], os.X_OK):
        raise ConfigError(f"command {command[0]!r} was not found on PATH and is not an "
                          "executable file; check the command after --")
    return tuple(command)


def _checkpoint_uri(uri: str | None, job_id: str) -> str:
    from spot_core.checkpoint import open_store

    if uri is None:
        uri = (Path.cwd() / ".spot-runs" / job_id / "checkpoints").as_uri()
    open_store(uri)  # validates the form; raises ConfigError naming the fix
    if uri.startswith("file://"):
        _check_writable(Path(uri.removeprefix("file://")))
    return uri


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"checkpoint folder {path} is not writable ({exc.strerror}); pass "
                          "--checkpoint-uri with a folder you can write to") from exc


def _non_negative(option: str, value: int) -> int:
    if value < 0:
        raise ConfigError(f"{option} must be 0 or more, got {value}")
    return value


def _provider(args: argparse.Namespace):
    if args.provider == "ec2":
        return _ec2_provider(args)
    if args.provider != "local":
        raise ConfigError(f"the {args.provider} provider is not built yet; use --provider local")
    from spot_core.market.trace import load_traces
    from spot_core.providers.local import LocalProvider

    if not args.time_scale > 0:
        raise ConfigError(f"--time-scale must be > 0, got {args.time_scale}")
    traces = None if not args.trace else load_traces(args.trace, prices=args.prices)
    return LocalProvider.from_traces(traces, time_scale=args.time_scale,
                                     start_tick=args.start_tick)


def _ec2_provider(args: argparse.Namespace):
    from spot_core.providers.ec2 import Ec2Provider

    options: dict = {}
    for item in args.ec2_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--ec2-option {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value  # a bare string
    missing = [flag for flag, value in (("--subnets", args.subnets),
                                        ("--instance-types", args.instance_types),
                                        ("--image-id", args.image_id)) if not value]
    if missing:
        raise ConfigError(f"--provider ec2 needs {', '.join(missing)} (see docs/aws.md)")
    if args.checkpoint_uri is None or not args.checkpoint_uri.startswith("s3://"):
        raise ConfigError("--provider ec2 needs --checkpoint-uri s3://bucket/prefix: the "
                          "instances cannot see this machine's disk")
    region = args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if args.endpoint_url:
        os.environ.setdefault("SPOT_S3_ENDPOINT_URL", args.endpoint_url)
    return Ec2Provider.from_options(
        region=region, endpoint_url=args.endpoint_url, subnets=_words(args.subnets),
        instance_types=_words(args.instance_types), image_id=args.image_id,
        instance_profile=args.instance_profile, **options)


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _pools(provider, names: str | None):
    pools = provider.pools()
    if not names:
        return pools
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {name: p for p in pools for name in (p.zone, p.key)}
    for trace in getattr(provider.market, "traces", ()):
        known.setdefault(trace.name, next(p for p in pools if p.zone == trace.zone))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"unknown pool(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(sorted(p.zone for p in pools))}")
    return tuple(dict.fromkeys(known[n] for n in wanted))


def _duration(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if not match:
        raise ConfigError(f"{option} {text!r} is not a duration; write it like 90m, 12h or 2d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _deadline(text: str | None, provider) -> float | None:
    """A duration counts in capacity time (scaled on the local cloud); an ISO time is wall time."""
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if match:
        capacity = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        return time.time() + capacity / provider.market.time_scale
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--deadline {text!r} is neither a duration (90m, 12h, 2d) nor an "
                          "ISO time (2026-12-01T08:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def record_json(record) -> str:
    return json.dumps(record.summary())
