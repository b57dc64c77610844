"""`spot-pipelines run`: one job under the controller, from the command line.

Like ``sky jobs launch`` for any command that uses the Checkpointer: the command runs on
spot capacity, is relaunched from its latest checkpoint after each preemption, moves to
on-demand when the preemption budget is spent or spot capacity runs out, and the
JobRecord summary is printed at the end. Every lease is terminated on every exit path.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from spot_core.bounds import MAX_TIME_SCALE
from spot_core.errors import ConfigError
from spot_core.settings import add_cli_arguments, in_flags, settings_from_cli


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run one command as a spot job under the controller")
    parser.add_argument("--pools", default=None, help="comma-separated zones or trace names to "
                        "run in (default: every pool the provider knows)")
    parser.add_argument("--trace", action="append", type=Path, default=None, metavar="PATH",
                        help="local provider: availability trace(s) to replay, one per zone "
                        "(default: the shipped AWS V100 excerpt)")
    parser.add_argument("--prices", type=Path, default=None, help="local provider: per-tick "
                        "spot price file {zone: [...]} for CSV traces")
    parser.add_argument("--on-demand-price", type=float, default=None, metavar="P",
                        help="local provider: on-demand $/h for traces that carry none "
                        "(default: the trace's, else 3.06 for the V100 traces)")
    parser.add_argument("--time-scale", type=float, default=3600.0, help="local provider: trace "
                        "seconds per wall second (default 3600: one trace hour per second)")
    parser.add_argument("--start-tick", type=int, default=0, help="local provider: trace tick "
                        "to start at (default 0)")
    # Budgets, waits, timeouts and the deadline policy: flags, defaults and help come
    # from the settings model (spot_core.settings), like every other surface's.
    add_cli_arguments(parser)
    parser.add_argument("--no-fallback", dest="on_demand_fallback", action="store_false",
                        default=None, help="the same as --no-on-demand-fallback")
    parser.add_argument("--checkpoint-uri", default=None, help="where the job checkpoints "
                        "(default: file://./.spot-runs/JOB_ID/checkpoints)")
    parser.add_argument("--job-id", default=None, help="job id (default: generated)")
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
    k8s = parser.add_argument_group("kubernetes provider (see docs/kubernetes.md)")
    k8s.add_argument("--kubeconfig", default=None, help="kubernetes: kubeconfig file "
                     "(default: $KUBECONFIG or ~/.kube/config; in a pod: its service account)")
    k8s.add_argument("--context", default=None, help="kubernetes: kubeconfig context")
    k8s.add_argument("--namespace", default=None, help="kubernetes: namespace of the step "
                     "pods (default: default)")
    k8s.add_argument("--k8s-option", action="append", default=[], metavar="KEY=JSON",
                     help="kubernetes: any other provider option, e.g. image=\"reg/step:1\" "
                     "or prices='{\"spot-ng\": {\"spot\": 0.07}}' (repeatable)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spot_core.controller import Controller, JobSpec
    from spot_core.observer import observer_of
    from spot_core.report import print_record
    from spot_core.stopping import stop_on_signals

    settings = _settings(args)
    # On kubernetes the command runs in the pod's image, not on this machine.
    command = _command(args.cmd, in_image=settings.image is not None
                       or settings.provider == "kubernetes")
    # Given but empty is a mistake (a script's unset variable), never "no job id".
    job_id = f"job-{uuid.uuid4().hex[:8]}" if args.job_id is None else args.job_id
    _check_job_id(job_id)
    wanted = _pool_names(args.pools)
    # SIGINT, SIGTERM and SIGHUP stop the job at the driver's next wait, never inside a
    # client call (spot_core.stopping); a second one stops it at once.
    with stop_on_signals(), _provider(args, settings) as provider:
        pools = _pools(provider, wanted)
        # The settings' time convention (spot_core.settings): --deadline, --work and
        # --restart-overhead count in the provider's capacity time.
        try:
            deadline = settings.deadline_spec(
                created_at=time.time(), capacity_per_wall=provider.capacity_seconds(1.0))
        except ConfigError as exc:
            raise ConfigError(in_flags(str(exc))) from None
        # Last of the checks: it creates the checkpoint folder, so a bad flag leaves none.
        checkpoint_uri = _checkpoint_uri(args.checkpoint_uri, job_id)
        spec = JobSpec(job_id=job_id, command=command, checkpoint_uri=checkpoint_uri,
                       pools=pools, image=settings.image, **deadline)
        controller = Controller(provider, provider.market, settings.retry_policy(),
                                listener=_print_event, **settings.controller_options())
        record = controller.run(spec, observer=observer_of(provider))
    print_record(record, provider.market.time_scale)
    if args.json:
        print(record.to_json(), flush=True)
    return 0 if str(record.status) == "succeeded" else 1


def _settings(args: argparse.Namespace):
    """The flags checked by the settings model; an ISO ``--deadline`` already past is
    refused here, before anything is created."""
    settings = settings_from_cli(args)
    if settings.deadline_at is not None and settings.deadline_at.timestamp() <= time.time():
        raise ConfigError(f"--deadline {args.deadline} has already passed; give a later time "
                          "or a duration such as 12h")
    return settings


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
    from spot_core.checkpoint import open_store, parse_store_uri

    _check_job_id(job_id)
    if uri is None:
        uri = (Path.cwd() / ".spot-runs" / job_id / "checkpoints").as_uri()
    location = parse_store_uri(uri)  # validates the form; raises ConfigError naming the fix
    if location.scheme == "file":  # the decoded path: file://localhost/x and %20 included
        _check_writable(Path(location.path))
    open_store(uri)
    return uri


JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=@-]{0,127}")


def _check_job_id(job_id: str) -> None:
    """The id names a folder under .spot-runs/ (and tags leases): a plain name, nothing
    that could climb out of that folder or break a path."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise ConfigError(f"--job-id {job_id[:80]!r} is not a plain name; use 1-128 letters, "
                          "digits and . _ : + = @ - starting with a letter or digit (no '/', "
                          "'..' or control characters)")


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"checkpoint folder {path} is not writable ({exc.strerror}); pass "
                          "--checkpoint-uri with a folder you can write to") from exc


def _provider(args: argparse.Namespace, settings):
    if settings.provider == "ec2":
        return _ec2_provider(args)
    if settings.provider == "kubernetes":
        return _kubernetes_provider(args)
    from spot_core.market.fixtures import fixture_prices_path, fixture_trace_paths
    from spot_core.market.trace import load_traces
    from spot_core.market.trace_market import check_time_scale
    from spot_core.model import MAX_PRICE_PER_HOUR
    from spot_core.providers.local import LocalProvider

    if not (math.isfinite(args.time_scale) and 0 < args.time_scale <= MAX_TIME_SCALE):
        raise ConfigError(f"--time-scale must be a finite number > 0 and at most "
                          f"{MAX_TIME_SCALE:,.0f} (trace seconds per wall second), got "
                          f"{args.time_scale}; e.g. --time-scale 3600")
    od = args.on_demand_price
    if od is not None and not (math.isfinite(od) and 0 < od <= MAX_PRICE_PER_HOUR):
        raise ConfigError(f"--on-demand-price must be a finite $/h > 0 and at most "
                          f"{MAX_PRICE_PER_HOUR:,.0f}, got {od}; e.g. --on-demand-price 3.06")
    if args.trace:
        traces = load_traces(args.trace, prices=args.prices, on_demand_price=od)
    else:
        traces = load_traces(fixture_trace_paths(), prices=fixture_prices_path(),
                             on_demand_price=od)
    check_time_scale(args.time_scale, traces[0].tick_seconds, name="--time-scale")
    ticks = min(t.n_ticks for t in traces)
    if not 0 <= args.start_tick < ticks:
        raise ConfigError(f"--start-tick {args.start_tick} is outside the traces' {ticks} "
                          f"ticks; give a tick from 0 to {ticks - 1}")
    return LocalProvider.from_traces(traces, time_scale=args.time_scale,
                                     start_tick=args.start_tick)


def _key_values(items: list[str], flag: str) -> dict:
    """``KEY=JSON`` flags as options (a value that is not JSON is a bare string)."""
    options: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value  # a bare string
    return options


def _kubernetes_provider(args: argparse.Namespace):
    from spot_core.providers import check_provider
    from spot_core.providers.kubernetes import KubernetesProvider

    from spot_core.providers.kubernetes_pods import mounted_store

    options = _key_values(args.k8s_option, "--k8s-option")
    for name in ("kubeconfig", "context", "namespace"):
        if getattr(args, name):
            options[name] = getattr(args, name)
    check_provider("kubernetes", options)
    if not mounted_store(args.checkpoint_uri, options.get("pod_template")):
        raise ConfigError("--provider kubernetes needs --checkpoint-uri s3://bucket/prefix, "
                          "or a file:// path under a volumeMount of the pod_template's step "
                          "container (--k8s-option pod_template=...): the pods cannot see "
                          "this machine's disk")
    return KubernetesProvider.from_options(**options)


def _ec2_provider(args: argparse.Namespace):
    from spot_core.providers.ec2 import Ec2Provider

    options = _key_values(args.ec2_option, "--ec2-option")
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


def _pool_names(text: str | None) -> list[str] | None:
    """``--pools`` as names; None when not given. Given but naming nothing is an error,
    never "no pools" (which would only wait, bounded but pointlessly, for capacity)."""
    if text is None:
        return None
    wanted = _words(text)
    if not wanted:
        raise ConfigError(f"--pools {text!r} names no pool; give comma-separated zones such "
                          "as us-east-2a,us-west-2b, or drop --pools to use every pool")
    return wanted


def _pools(provider, wanted: list[str] | None):
    pools = provider.pools()
    if wanted is None:
        return pools
    known = {name: p for p in pools for name in (p.zone, p.key)}
    for trace in getattr(provider.market, "traces", ()):
        known.setdefault(trace.name, next(p for p in pools if p.zone == trace.zone))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"unknown pool(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(sorted(p.zone for p in pools))}")
    return tuple(dict.fromkeys(known[n] for n in wanted))


def record_json(record) -> str:
    return json.dumps(record.summary(), allow_nan=False)
