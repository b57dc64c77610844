"""The EC2 provider: leases are EC2 instances, spot or on-demand, in ranked pools.

A pool is (region, availability zone, instance type, market). ``launch`` starts one
instance with ``run_instances`` (spot through ``InstanceMarketOptions``), or, in
``launch_mode="fleet"``, through an ``instant`` ``create_fleet`` whose overrides are every
subnet of the pool's zone; ``launch_any`` asks one fleet for any of several pools of a
region at once (allocation strategy ``price-capacity-optimized`` by default, or
``capacity-optimized``), which is how EC2 itself prefers to diversify.

Every instance:
- runs the step under ``spot-pipelines watch -- CMD`` from user-data (``ec2_agent``),
  with the attempt's variables exported and nothing secret in it (names that look like
  credentials are refused; the instance profile provides access), after installing a
  pinned spot-pipelines if the ``bootstrap`` option says the image lacks it
  (``ec2_bootstrap``);
- requires IMDSv2 (``HttpTokens=required``) and terminates itself when the step ends
  (``InstanceInitiatedShutdownBehavior=terminate``);
- carries ``spot-pipelines:managed=true``, ``spot-pipelines:job`` and
  ``spot-pipelines:attempt`` on the instance and its volumes (cost allocation, orphan
  cleanup), plus ``Name`` and any extra tags.

Capacity errors (``InsufficientInstanceCapacity``, ``SpotMaxPriceTooLow``,
``MaxSpotInstanceCountExceeded``, ...) become ``CapacityUnavailable`` so the controller
moves on to the next pool; throttling is backed off (bounded) in ``spot_core.adaptors.aws``.

``observe`` answers any number of leases with one ``describe_instances`` per region per
500 instances that asks only which of them have left ``pending``/``running`` (the ids plus
an ``instance-state-name`` filter: EC2 checks the ids before it filters, so an unknown id
is still an error, and an instance absent from the answer is alive). The answer is almost
always empty, where describing every watched instance cost a 3 MB answer per 1,000 and
most of a watcher's CPU. Then one ``describe_spot_instance_requests`` for the spot
requests (ids from the launch), an optional drain of an EventBridge SQS queue, and a read
of the status object the instance's watcher writes next to the checkpoints: for a running
spot instance whose notice is not yet known (at most every ``NODE_REPORT_SECONDS``; the
watcher writes it the moment it sees the notice, so ``handover=on_notice`` needs no event
queue: EC2's own API says nothing of a notice until the instance is gone), and for every
instance that has ended. When a region watches more spot requests than one call by id
answers (``DESCRIBE_BATCH``), it lists the open or active ones instead, when that takes
fewer calls (``LIST_PAGE`` per page, following ``NextToken``); a request the listing lacks
is asked by id. Answers are cut to the fields ``observe`` reads before botocore parses
them (``ec2_lean``).

Cross-region: the checkpoint stays where it was written (``checkpoint_region``); an
attempt in another region reads it from there, and the bytes of the checkpoint it resumes
from are billed at ``data_transfer_price_per_gb`` into that lease's ``Bill.cost``, itemised as
``Bill.data_transfer_cost`` (the ledger's ``data_transfer_cost``) and in ``lease.details``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from spot_core import attempt_env, container
from spot_core.adaptors import aws
from spot_core.checkpoint.status import parse_report, status_key
from spot_core.credentials import credential_findings
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.market.ec2 import Ec2Market
from spot_core.model import Lease, Market, Pool
from spot_core.providers import ec2_agent, ec2_lean
from spot_core.providers.base import (
    Bill,
    Capability,
    LaunchSpec,
    LeaseState,
    LeaseStatus,
    Provider,
    ProviderPlugin,
    SessionKind,
    key_values,
)
from spot_core.providers.ec2_bootstrap import Bootstrap

if TYPE_CHECKING:
    from spot_core.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)

CLOUD = "aws"
TAG_MANAGED = "spot-pipelines:managed"
TAG_JOB = "spot-pipelines:job"
TAG_ATTEMPT = "spot-pipelines:attempt"
DESCRIBE_BATCH = 500  # ids per describe by id
NOT_FOUND_GRACE = 120.0  # seconds after launch an id EC2 does not know yet is still starting
LIST_PAGE = 1000  # MaxResults of a listing (EC2's maximum; not allowed with ids)
ENDED_STATES = ("shutting-down", "terminated", "stopping", "stopped")  # not pending/running
ENDED_FILTER = ({"Name": "instance-state-name", "Values": list(ENDED_STATES)},)
LISTED_SPOT_STATES = ("open", "active")
LIST_SIZE_MEMORY = 600.0  # seconds a listing's size is trusted to predict the next one
LIVE_STATES = ("pending", "running", "stopping", "stopped")
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


@dataclass(frozen=True)
class Ec2Options:
    """Everything the provider needs, as plain JSON-able values (see ``from_plain``)."""

    subnets: Mapping[str, Sequence[str]]  # region -> subnet ids
    instance_types: tuple[str, ...]
    image_id: Mapping[str, str]  # region -> AMI id
    instance_profile: str | None = None  # name or ARN
    security_group_ids: Mapping[str, Sequence[str]] = field(default_factory=dict)
    endpoint_url: str | None = None
    checkpoint_region: str | None = None
    launch_mode: str = "instance"  # instance | fleet
    allocation_strategy: str = "price-capacity-optimized"
    spot_max_price: float | None = None
    watch_command: str = "spot-pipelines"
    agent_python: str = "python3"
    watch_poll_interval: float = 1.0
    sqs_queue_url: str | None = None
    advisor_path: str | None = None
    on_demand_prices: Mapping[str, Any] = field(default_factory=dict)
    extra_tags: Mapping[str, str] = field(default_factory=dict)
    data_transfer_price_per_gb: float = 0.02
    price_refresh_seconds: float = 300.0
    # Install a pinned spot-pipelines at boot when image_id lacks it (ec2_bootstrap):
    # {"pip": "spot-pipelines[aws]==0.1.0"} or {"wheel": "s3://bucket/....whl"}.
    bootstrap: Mapping[str, Any] | None = None

    @classmethod
    def from_plain(
        cls,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        subnets: Sequence[str] | Mapping[str, Sequence[str]] = (),
        instance_types: Sequence[str] = (),
        image_id: str | Mapping[str, str] = "",
        instance_profile: str | None = None,
        security_group_ids: Sequence[str] | Mapping[str, Sequence[str]] = (),
        checkpoint_region: str | None = None,
        **rest: Any,
    ) -> Ec2Options:
        """Checked options from plain JSON-able values, without any AWS call.

        ``subnets``: a list of subnet ids in ``region``, or ``{region: [subnet ids]}`` for
        several regions. ``image_id``: one AMI id, or ``{region: ami}``. ``security_group_ids``
        likewise. Any other ``Ec2Options`` field may be given by name.
        """
        check_option_names(rest)
        by_region = _per_region(subnets, region, "subnets")
        images = _per_region_scalar(image_id, by_region, "image_id")
        groups = (
            _per_region(security_group_ids, region, "security_group_ids")
            if security_group_ids
            else {}
        )
        for key in ("extra_tags", "on_demand_prices"):
            if key in rest:
                if not isinstance(rest[key], Mapping):
                    raise ConfigError(
                        f"ec2 provider option {key} must be a mapping, e.g. {_EXAMPLES[key]}"
                    )
                rest[key] = dict(rest[key])
        if isinstance(rest.get("bootstrap"), Mapping):  # anything else: Bootstrap says why
            rest["bootstrap"] = dict(rest["bootstrap"])
        options = cls(
            subnets={r: tuple(s) for r, s in by_region.items()},
            instance_types=tuple(instance_types),
            image_id=images,
            instance_profile=instance_profile,
            security_group_ids={r: tuple(g) for r, g in groups.items()},
            endpoint_url=endpoint_url,
            checkpoint_region=checkpoint_region or next(iter(by_region), None),
            **rest,
        )
        _validate(options)
        return options

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(self.subnets)

    def to_options(self) -> dict[str, Any]:
        """Plain JSON-able keyword arguments for ``Ec2Provider.from_options``."""

        def plain(value: Any) -> Any:
            if isinstance(value, Mapping):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


class Ec2Provider:
    """Provider protocol over the EC2 API (and anything that speaks it, such as moto)."""

    name = "ec2"
    capabilities = (
        Capability.SPOT
        | Capability.OWN_STORES
        | Capability.LAUNCH_ANY
        | Capability.LEASE_TAGS
        | Capability.CLEANUP_ORPHANS
        | Capability.IMAGES
        | Capability.PARALLEL_LAUNCH
    )

    def __init__(
        self,
        options: Ec2Options,
        *,
        clients: Mapping[str, Any] | None = None,
        sqs_client: Any = None,
        session: aws.Access = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _validate(options)
        self.config = options
        # JSON-able and credential-free: `open_provider("ec2", session=..., **provider.options)`
        # reopens this provider elsewhere, with that process's own session (its engine
        # resolves the same connection or block again).
        self.options = options.to_options()
        self.access = aws.access_of(session)
        self.clock = clock
        self.clients = dict(
            clients
            or {
                r: aws.make_client(
                    "ec2", region=r, endpoint_url=options.endpoint_url, session=self.access
                )
                for r in options.regions
            }
        )
        for client in self.clients.values():
            ec2_lean.install(client)
        self._listed: dict[tuple[str, str], tuple[int, float]] = {}  # (what, region) -> size, when
        self._request_ids: dict[str, str] = {}  # instance id -> spot request id ("" for none)
        self._zones = self._resolve_subnets()
        from spot_core.market.advisor import load_advisor

        self.market = Ec2Market(
            self.clients,
            self._spot_pools(),
            load_advisor(options.advisor_path),
            on_demand_prices=options.on_demand_prices,
            refresh_seconds=options.price_refresh_seconds,
            clock=clock,
        )
        self._events = None
        if options.sqs_queue_url:
            from spot_core.interruption.eventbridge import EventQueue

            sqs = sqs_client or aws.make_client(
                "sqs",
                region=options.regions[0],
                endpoint_url=options.endpoint_url,
                session=self.access,
            )
            self._events = EventQueue(sqs, options.sqs_queue_url)
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._terminated: set[str] = set()
        self._notices: dict[str, float] = {}
        self._report_read: dict[str, float] = {}  # instance id -> last read (monotonic)
        self._rebalances: dict[str, float] = {}  # instance id -> rebalance recommendation

    @classmethod
    def from_options(cls, *, session: aws.Access = None, **options: Any) -> Ec2Provider:
        """Build from plain JSON-able options (what engine adapters store and pass; see
        ``Ec2Options.from_plain``) and the process's ``session`` (a boto3 Session or
        ``AwsAccess`` from the engine's connection or block; None: boto3's default
        chain). The session's region is the default ``region``."""
        access = aws.access_of(session)
        if access.region and not options.get("region"):
            options = {**options, "region": access.region}
        return cls(Ec2Options.from_plain(**options), session=access)

    def open_store(self, uri: str, region: str | None = None) -> CheckpointStore:
        """The job's checkpoint store, reached with this provider's credentials and
        endpoint (the controller opens every store of its jobs through here)."""
        from spot_core.checkpoint import open_store

        if not uri.startswith("s3://"):
            return open_store(uri)
        # The stores share one S3 client per region (``aws.shared_client``).
        return open_store(
            uri,
            session=self.access,
            endpoint_url=self.config.endpoint_url,
            region=region or self.config.checkpoint_region,
        )

    # -- pools --------------------------------------------------------------------------
    def _resolve_subnets(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """region -> zone -> subnet ids, from one describe_subnets per region."""
        zones: dict[str, dict[str, tuple[str, ...]]] = {}
        for region, subnet_ids in self.config.subnets.items():
            answer = aws.call(
                f"ec2:DescribeSubnets in {region}",
                self.clients[region].describe_subnets,
                SubnetIds=list(subnet_ids),
            )
            per_zone: dict[str, list[str]] = {}
            for subnet in sorted(
                answer["Subnets"], key=lambda s: list(subnet_ids).index(s["SubnetId"])
            ):
                per_zone.setdefault(subnet["AvailabilityZone"], []).append(subnet["SubnetId"])
            zones[region] = {z: tuple(s) for z, s in per_zone.items()}
        return zones

    def _spot_pools(self) -> tuple[Pool, ...]:
        return tuple(
            Pool(CLOUD, region, zone, instance_type, Market.SPOT)
            for region, zones in self._zones.items()
            for zone in zones
            for instance_type in self.config.instance_types
        )

    def pools(self) -> tuple[Pool, ...]:
        return self._spot_pools()

    # -- launch -------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        """One instance in ``pool``; CapacityUnavailable if EC2 has none there."""
        subnets = self._subnets_for(pool)
        if self.config.launch_mode == "fleet":
            return self._launch_fleet(spec, [pool], subnets_by_pool={pool.key: subnets})
        errors = []
        for subnet in subnets:
            try:
                return self._run_instance(spec, pool, subnet)
            except CapacityUnavailable as exc:
                errors.append(str(exc))
        self.market.note_capacity_miss(pool, self.clock())
        raise CapacityUnavailable(
            f"no {pool.market} capacity for {pool.instance_type} in "
            f"{pool.zone}: {'; '.join(errors)}"
        )

    def launch_any(self, spec: LaunchSpec, pools: Sequence[Pool]) -> Lease:
        """One instance from any of ``pools`` (same region and market) via one instant fleet."""
        if not pools or len({(p.region, p.market) for p in pools}) != 1:
            raise ConfigError("launch_any needs pools of one region and one market")
        return self._launch_fleet(
            spec, list(pools), subnets_by_pool={p.key: self._subnets_for(p) for p in pools}
        )

    def _subnets_for(self, pool: Pool) -> tuple[str, ...]:
        try:
            return self._zones[pool.region][pool.zone]
        except KeyError:
            raise ConfigError(
                f"pool {pool.key} is not one this provider offers: no subnet in "
                f"{pool.zone}; add one to the subnets option"
            ) from None

    def _run_instance(self, spec: LaunchSpec, pool: Pool, subnet: str) -> Lease:
        request = self._instance_request(spec, pool)
        request.update(
            ImageId=self.config.image_id[pool.region],
            InstanceType=pool.instance_type,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet,
            ClientToken=f"{spec.job_id}-{spec.attempt}-{pool.zone}-"
            f"{pool.instance_type}-{pool.market}"[:64],
        )
        if pool.is_spot:
            spot = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if self.config.spot_max_price is not None:
                spot["MaxPrice"] = f"{self.config.spot_max_price:.4f}"
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        with self._reaping(spec, pool.region):
            answer = aws.call(
                f"ec2:RunInstances {pool.market} {pool.instance_type} in {pool.zone}",
                self.clients[pool.region].run_instances,
                **request,
            )
            return self._lease(spec, pool, answer["Instances"][0])

    @contextlib.contextmanager
    def _reaping(self, spec: LaunchSpec, region: str) -> Iterator[None]:
        """Whatever stops a launch between its create call and the lease handed back (a
        Ctrl-C or SIGTERM while the answer is read, a failed describe or store read after
        it) terminates the attempt's instances, found by their tags: the answer naming
        them may never have been read. A capacity miss made none, so costs no call."""
        try:
            yield
        except CapacityUnavailable:
            raise
        except BaseException:
            try:
                ids = self._live_tagged(
                    region,
                    [
                        {"Name": f"tag:{TAG_JOB}", "Values": [spec.job_id]},
                        {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(spec.attempt)]},
                    ],
                )
                if ids:
                    self._terminate_ids(region, ids)
                    log.warning(
                        "terminated %s: its launch for %s attempt %d was cut short",
                        ", ".join(ids),
                        spec.job_id,
                        spec.attempt,
                    )
            except Exception as exc:  # noqa: BLE001 - the first error is the one to report
                log.warning(
                    "could not check for instances of %s attempt %d after a cut-short "
                    "launch (cleanup_orphans remains): %s",
                    spec.job_id,
                    spec.attempt,
                    exc,
                )
            raise

    def _instance_request(self, spec: LaunchSpec, pool: Pool) -> dict[str, Any]:
        """The launch parameters every instance shares (run_instances and launch templates)."""
        request: dict[str, Any] = {
            "UserData": self._user_data(spec),
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": 2,
            },
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": self._tags(spec)} for kind in ("instance", "volume")
            ],
        }
        profile = self.config.instance_profile
        if profile:
            request["IamInstanceProfile"] = (
                {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
            )
        groups = self.config.security_group_ids.get(pool.region)
        if groups:
            request["SecurityGroupIds"] = list(groups)
        return request

    def _launch_fleet(
        self, spec: LaunchSpec, pools: list[Pool], subnets_by_pool: Mapping[str, Sequence[str]]
    ) -> Lease:
        region = pools[0].region
        client = self.clients[region]
        template = self._instance_request(spec, pools[0])
        template.pop("InstanceInitiatedShutdownBehavior")  # not a launch-template field for fleets
        template["ImageId"] = self.config.image_id[region]
        # run_instances base64-encodes user-data itself; launch template data must carry it so.
        template["UserData"] = base64.b64encode(template["UserData"].encode()).decode()
        name = f"spot-pipelines-{spec.job_id}-{spec.attempt}-{int(self.clock() * 1000)}"[:128]
        created = aws.call(
            f"ec2:CreateLaunchTemplate in {region}",
            client.create_launch_template,
            LaunchTemplateName=name,
            LaunchTemplateData=template,
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": self._tags(spec)}],
        )
        template_id = created["LaunchTemplate"]["LaunchTemplateId"]
        with self._reaping(spec, region):
            return self._fleet_lease(spec, pools, client, template_id, subnets_by_pool)

    def _fleet_lease(
        self,
        spec: LaunchSpec,
        pools: list[Pool],
        client: Any,
        template_id: str,
        subnets_by_pool: Mapping[str, Sequence[str]],
    ) -> Lease:
        region, market = pools[0].region, pools[0].market
        try:
            overrides = [
                {"InstanceType": p.instance_type, "SubnetId": s, "Priority": float(rank)}
                for rank, p in enumerate(pools)
                for s in subnets_by_pool[p.key]
            ]
            capacity = "spot" if market is Market.SPOT else "on-demand"
            answer = aws.call(
                f"ec2:CreateFleet {capacity} in {region}",
                client.create_fleet,
                Type="instant",
                LaunchTemplateConfigs=[
                    {
                        "LaunchTemplateSpecification": {
                            "LaunchTemplateId": template_id,
                            "Version": "$Latest",
                        },
                        "Overrides": overrides,
                    }
                ],
                TargetCapacitySpecification={
                    "TotalTargetCapacity": 1,
                    "DefaultTargetCapacityType": capacity,
                },
                SpotOptions={"AllocationStrategy": self.config.allocation_strategy},
                OnDemandOptions={"AllocationStrategy": "prioritized"},
                TagSpecifications=[{"ResourceType": "fleet", "Tags": self._tags(spec)}],
            )
        finally:
            self._delete_template(client, template_id)
        instance_ids = [i for group in answer.get("Instances", []) for i in group["InstanceIds"]]
        if not instance_ids:
            codes = sorted({e.get("ErrorCode", "?") for e in answer.get("Errors", [])})
            for pool in pools:
                self.market.note_capacity_miss(pool, self.clock())
            raise CapacityUnavailable(
                f"fleet found no {capacity} capacity in {region} for "
                f"{[p.key for p in pools]} ({', '.join(codes) or 'no reason'})"
            )
        extra = instance_ids[1:]
        if extra:  # never more than one lease per attempt
            self._terminate_ids(region, extra)
        described = self._describe(region, instance_ids[:1]).get(instance_ids[0])
        if described is None:
            raise InfrastructureError(
                f"fleet reported {instance_ids[0]} but describe_instances does not know it; retry"
            )
        pool = next(
            (
                p
                for p in pools
                if p.instance_type == described["InstanceType"]
                and p.zone == described.get("Placement", {}).get("AvailabilityZone")
            ),
            pools[0],
        )
        return self._lease(spec, pool, described)

    def _delete_template(self, client: Any, template_id: str) -> None:
        try:
            aws.call(
                "ec2:DeleteLaunchTemplate",
                client.delete_launch_template,
                LaunchTemplateId=template_id,
            )
        except Exception as exc:  # noqa: BLE001 - a leftover template costs nothing; say so and go on
            log.warning("could not delete launch template %s: %s", template_id, exc)

    def _lease(self, spec: LaunchSpec, pool: Pool, instance: Mapping[str, Any]) -> Lease:
        now = self.clock()
        offer = self.market.offers([pool], now)[0]
        transfer_bytes = self._transfer_bytes(spec, pool)
        transfer_cost = transfer_bytes / GB * self.config.data_transfer_price_per_gb
        details = {
            "region": pool.region,
            "subnet": str(instance.get("SubnetId", "")),
            "checkpoint_uri": spec.checkpoint_uri,
            "checkpoint_region": str(self.config.checkpoint_region or pool.region),
            "data_transfer_bytes": str(transfer_bytes),
            "data_transfer_cost": f"{transfer_cost:.6f}",
            "tags": f"{TAG_JOB}={spec.job_id},{TAG_ATTEMPT}={spec.attempt}",
        }
        if instance.get("SpotInstanceRequestId"):
            details["spot_request_id"] = instance["SpotInstanceRequestId"]
        lease = Lease(
            lease_id=instance["InstanceId"],
            pool=pool,
            job_id=spec.job_id,
            attempt=spec.attempt,
            started_at=now,
            price_per_hour=offer.price_per_hour,
            details=details,
        )
        with self._lock:
            self._leases[lease.lease_id] = lease
        log.info(
            "launched %s (%s) for %s attempt %d",
            lease.lease_id,
            pool.key,
            spec.job_id,
            spec.attempt,
        )
        return lease

    def _transfer_bytes(self, spec: LaunchSpec, pool: Pool) -> int:
        """Bytes of the checkpoint this attempt resumes from, if it must cross regions."""
        home = self.config.checkpoint_region
        if home is None or home == pool.region or not spec.checkpoint_uri.startswith("s3://"):
            return 0
        store = self.open_store(spec.checkpoint_uri, region=home)
        refs = store.list()
        return store.size_of(refs[-1]) if refs else 0

    def _user_data(self, spec: LaunchSpec) -> str:
        env = dict(spec.env)
        refuse_credentials_in_env(env)
        attempt = attempt_env.AttemptEnv(
            checkpoint_uri=spec.checkpoint_uri,
            job_id=spec.job_id,
            attempt=spec.attempt,
            metadata_endpoint=None,
            cloud=CLOUD,
            notice_file=None,
            heartbeat_timeout=spec.heartbeat_timeout_seconds,
        )
        env.update(attempt.to_environ())
        command = spec.command
        if spec.image:
            command = container.wrap(
                spec.image, spec.command, tuple(spec.env), python=self.config.agent_python
            )
        return ec2_agent.user_data(
            command=command,
            environ=env,
            watch_command=self.config.watch_command,
            agent_python=self.config.agent_python,
            poll_interval=self.config.watch_poll_interval,
            bootstrap=Bootstrap.from_plain(self.config.bootstrap),
        )

    def _tags(self, spec: LaunchSpec) -> list[dict[str, str]]:
        tags = {
            **self.config.extra_tags,
            "Name": f"spot-pipelines {spec.job_id} #{spec.attempt}",
            TAG_MANAGED: "true",
            TAG_JOB: spec.job_id,
            TAG_ATTEMPT: str(spec.attempt),
        }
        return [{"Key": k, "Value": str(v)} for k, v in tags.items()]

    # -- observe ------------------------------------------------------------------------
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

    def _describe(self, region: str, instance_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Instance id -> description; an unknown id is left out."""
        return {
            i: d
            for i, d in self._describe_in_batches(region, instance_ids).items()
            if d is not None
        }

    def _describe_in_batches(
        self, region: str, instance_ids: Sequence[str], filters: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, dict[str, Any] | None]:
        """``_describe_batch`` over ``DESCRIBE_BATCH`` ids per call."""
        found: dict[str, dict[str, Any] | None] = {}
        for start in range(0, len(instance_ids), DESCRIBE_BATCH):
            found.update(
                self._describe_batch(
                    region, list(instance_ids[start : start + DESCRIBE_BATCH]), filters
                )
            )
        return found

    def _describe_batch(
        self, region: str, ids: list[str], filters: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, dict[str, Any] | None]:
        """The ids' descriptions that match ``filters``; an id EC2 does not know maps to
        None (EC2 refuses the whole call for one unknown id: it is found by halving)."""
        if not ids:
            return {}
        client = self.clients[region]
        query: dict[str, Any] = {
            "InstanceIds": ids,
            **({"Filters": list(filters)} if filters else {}),
        }
        try:
            pages = aws.call_raw(
                lambda: list(client.get_paginator("describe_instances").paginate(**query))
            )
        except aws.client_error_class() as exc:
            if aws.error_code(exc) != "InvalidInstanceID.NotFound":
                raise aws.translate(exc, f"ec2:DescribeInstances in {region}") from exc
            if len(ids) == 1:
                return {ids[0]: None}
            half = len(ids) // 2  # find the unknown ids by halving; rare
            return {
                **self._describe_batch(region, ids[:half], filters),
                **self._describe_batch(region, ids[half:], filters),
            }
        return {
            i["InstanceId"]: i
            for page in pages
            for r in page["Reservations"]
            for i in r["Instances"]
        }

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

    def instance_tag(self, region: str, instance_id: str, key: str) -> str | None:
        """The value of tag ``key`` on an instance (terminated ones stay describable for
        a while), or None if it has no such tag or is unknown."""
        client = self.clients.get(region)
        if client is None:
            raise ConfigError(
                f"instance {instance_id} is in region {region!r}, which this "
                f"provider does not use ({list(self.clients)})"
            )
        instance = self._describe_batch(region, [instance_id]).get(instance_id) or {}
        return next((t.get("Value") for t in instance.get("Tags", []) if t.get("Key") == key), None)

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

    # -- money --------------------------------------------------------------------------
    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """Per-second billing at the spot price in effect each second, plus cross-region
        data transfer (costs one DescribeSpotPriceHistory call per ended spot attempt)."""
        seconds = max(0.0, ended_at - lease.started_at)
        on_demand = self.market.on_demand_price(lease.pool.region, lease.pool.instance_type)
        transfer = float(lease.details.get("data_transfer_cost", 0.0) or 0.0)
        if lease.pool.is_spot:
            capacity_cost = self.market.spot_cost(
                lease.pool, lease.started_at, lease.started_at + seconds, lease.price_per_hour
            )
        else:
            capacity_cost = on_demand * seconds / 3600.0
        return Bill(
            cost=capacity_cost + transfer,
            on_demand_cost=on_demand * seconds / 3600.0,
            capacity_seconds=seconds,
            data_transfer_cost=transfer,
        )

    def capacity_seconds(self, wall_seconds: float) -> float:
        return wall_seconds

    # -- terminate ----------------------------------------------------------------------
    def terminate(self, lease: Lease) -> None:
        with self._lock:
            self._terminated.add(lease.lease_id)
        self._terminate_ids(lease.pool.region, [lease.lease_id])

    def _terminate_ids(self, region: str, ids: Sequence[str]) -> None:
        for start in range(0, len(ids), 1000):
            batch = list(ids[start : start + 1000])
            try:
                aws.call(
                    f"ec2:TerminateInstances in {region}",
                    self.clients[region].terminate_instances,
                    InstanceIds=batch,
                )
            except InfrastructureError as exc:
                if "InvalidInstanceID.NotFound" not in str(exc):
                    raise
                for one in batch if len(batch) > 1 else ():
                    self._terminate_ids(region, [one])

    def close(self) -> None:
        """Terminate every instance this provider launched (idempotent)."""
        with self._lock:
            leases = list(self._leases.values())
            self._terminated.update(each.lease_id for each in leases)
        by_region: dict[str, list[str]] = {}
        for lease in leases:
            by_region.setdefault(lease.pool.region, []).append(lease.lease_id)
        for region, ids in by_region.items():
            self._terminate_ids(region, ids)

    def cleanup_orphans(self, job_id: str | None = None) -> list[str]:
        """Terminate every live instance tagged ``spot-pipelines:managed=true`` (of
        ``job_id`` only, if given) in this provider's regions; return their ids."""
        filters = [] if job_id is None else [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}]
        doomed: list[str] = []
        for region in self.clients:
            ids = self._live_tagged(region, filters)
            if ids:
                self._terminate_ids(region, ids)
                doomed += ids
        if doomed:
            shown = ", ".join(doomed[:10]) + (
                f" and {len(doomed) - 10} more" if len(doomed) > 10 else ""
            )
            log.warning("terminated %d orphaned instance(s): %s", len(doomed), shown)
        return doomed

    def _live_tagged(self, region: str, filters: list[dict[str, Any]]) -> list[str]:
        """The ids of the live instances this project launched in ``region`` that match
        ``filters`` as well."""
        client = self.clients[region]
        filters = [
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            *filters,
        ]
        pages = aws.call(
            f"ec2:DescribeInstances in {region}",
            lambda: list(client.get_paginator("describe_instances").paginate(Filters=filters)),
        )
        return [
            i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]
        ]

    def __enter__(self) -> Ec2Provider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- option helpers ------------------------------------------------------------------------
def check_option_names(names: Iterable[str]) -> None:
    """ConfigError naming the valid choices if any of ``names`` is not an ec2 provider
    option (engine adapters call it to reject a configuration before anything opens)."""
    known = {f.name for f in fields(Ec2Options)} | {"region"}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(f"unknown ec2 provider option(s) {unknown}; choose from {sorted(known)}")


def refuse_credentials_in_env(env: Mapping[str, str]) -> None:
    """The step's environment goes into EC2 user-data: one line naming each variable that
    looks like a credential (by name or value, never quoting it) and the fix."""
    found = credential_findings(env)
    if found:
        which = ", ".join(f"{name} ({why})" for name, why in sorted(found.items()))
        raise ConfigError(
            f"env {which} looks like credentials and would be written into "
            "EC2 user-data, which anyone with ec2:DescribeInstanceAttribute "
            "can read; grant access through the instance profile (or read "
            "the secret from Secrets Manager in the step) instead, or "
            "rename a variable that holds no secret"
        )


def _validate(options: Ec2Options) -> None:
    if not options.subnets or not all(options.subnets.values()):
        raise ConfigError(
            "the ec2 provider needs subnets: subnets=['subnet-...'] (one per "
            "availability zone to use) or {region: [subnet ids]}"
        )
    if not options.instance_types:
        raise ConfigError(
            "the ec2 provider needs instance_types, e.g. ['g5.xlarge', 'g4dn.xlarge']"
        )
    missing = [r for r in options.regions if not options.image_id.get(r)]
    if missing:
        raise ConfigError(
            f"no image_id for region(s) {missing}; pass image_id='ami-...' or "
            "{region: 'ami-...'} (an AMI with spot-pipelines installed, or "
            "one with Python 3.11+ and the bootstrap option)"
        )
    Bootstrap.from_plain(options.bootstrap)
    _check_on_demand_prices(options.on_demand_prices)
    if options.launch_mode not in ("instance", "fleet"):
        raise ConfigError(f"launch_mode {options.launch_mode!r} is not 'instance' or 'fleet'")
    if options.allocation_strategy not in (
        "price-capacity-optimized",
        "capacity-optimized",
        "lowest-price",
        "diversified",
    ):
        raise ConfigError(
            f"allocation_strategy {options.allocation_strategy!r} is not one of "
            "price-capacity-optimized, capacity-optimized, lowest-price, diversified"
        )


_EXAMPLES = {
    "extra_tags": "{'team': 'ml'}",
    "on_demand_prices": "{'g5.xlarge': 1.006} or {'eu-west-1': {'g5.xlarge': 1.123}}",
}


def _check_on_demand_prices(prices: Any) -> None:
    """A mapping whose every price is a finite number of $/h >= 0, by instance type or by
    region then type: a bad one would otherwise surface as a wrong cost, or a crash in the
    middle of a job."""
    if not isinstance(prices, Mapping):
        raise ConfigError(
            f"ec2 provider option on_demand_prices must be a mapping, e.g. "
            f"{_EXAMPLES['on_demand_prices']}"
        )
    for key, value in prices.items():
        table = value if isinstance(value, Mapping) else {key: value}
        for instance_type, price in table.items():
            if (
                isinstance(price, bool)
                or not isinstance(price, (int, float))
                or not math.isfinite(price)
                or price < 0
            ):
                raise ConfigError(
                    f"on_demand_prices: {instance_type} -> {price!r} is not a price; give "
                    f"a finite number of $/h >= 0, e.g. {_EXAMPLES['on_demand_prices']}"
                )


def _per_region(
    value: Sequence[str] | Mapping[str, Sequence[str]], region: str | None, what: str
) -> dict[str, list[str]]:
    if isinstance(value, Mapping):
        return {str(r): list(v) for r, v in value.items()}
    if isinstance(value, str):
        value = [value]
    if not region:
        raise ConfigError(
            f"{what} given as a list needs region=... (or a region on the AWS "
            f"connection / credentials block); or pass {{region: [...]}}"
        )
    return {region: list(value)}


def _per_region_scalar(
    value: str | Mapping[str, str], regions: Mapping[str, Any], what: str
) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(r): str(v) for r, v in value.items()}
    return {r: str(value) for r in regions} if value else {}


# -- the plugin: what the engines know of this provider -----------------------------------------
REQUIRED = ("subnets", "image_id")


class Ec2Plugin(ProviderPlugin):
    """EC2 spot and on-demand instances, reached with an AWS session."""

    capabilities = Ec2Provider.capabilities
    session = SessionKind.AWS
    summary = "AWS EC2 spot and on-demand instances (needs an s3:// checkpoint store)"
    lease_noun = "instances"

    def open(self, options: Mapping[str, Any], session: Any = None) -> Provider:
        return Ec2Provider.from_options(session=session, **options)

    def check_options(self, options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
        """Every name an ec2 option; ``subnets``, ``image_id`` and ``instance_types`` (in the
        options or the configuration's own list) present; a ``bootstrap`` well formed. The
        region may come from the environment of the process that opens the provider, so it
        is not required here."""
        check_option_names(options)
        Bootstrap.from_plain(options.get("bootstrap"))
        _check_on_demand_prices(options.get("on_demand_prices", {}))
        missing = [name for name in REQUIRED if not options.get(name)]
        if not options.get("instance_types") and not instance_types:
            missing.append("instance_types")
        if missing:
            raise ConfigError(
                f"provider {self.name!r} needs provider_options {missing}, e.g. "
                "{'region': 'us-east-1', 'subnets': ['subnet-...'], 'image_id': "
                "'ami-...', 'instance_types': ['g5.xlarge'], 'instance_profile': "
                "'spot-step'} (see docs/aws.md)"
            )

    def check_env(self, env: Mapping[str, str]) -> None:
        refuse_credentials_in_env(env)

    def option_defaults(
        self,
        options: Mapping[str, Any],
        *,
        instance_types: Sequence[str] = (),
        session: Any = None,
        scratch_dir: str | None = None,
    ) -> dict[str, Any]:
        """The region: the session's, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; the
        instance types: the settings' when the options name none."""
        options = dict(options)
        region = (
            (None if session is None else aws.access_of(session).region)
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
        )
        if region and "region" not in options:
            options["region"] = region
        if instance_types and not options.get("instance_types"):
            options["instance_types"] = list(instance_types)
        return options

    def lease_python(self, options: Mapping[str, Any]) -> str:
        """The instance's own Python: ``agent_python`` (the on-instance agent's)."""
        return str(options.get("agent_python") or "python3")

    def console_link(self, lease: Lease) -> str | None:
        return (
            f"https://console.aws.amazon.com/ec2/home?region={lease.pool.region}"
            f"#InstanceDetails:instanceId={lease.lease_id}"
        )

    def publish_from_lease(self, key: str, value: str, environ: Mapping[str, str]) -> bool:
        """On one of its instances (user-data exports ``SPOT_CLOUD=aws``): a tag on the
        instance itself, which only that instance may set."""
        if environ.get(attempt_env.CLOUD) != CLOUD:
            return False
        ec2_agent.tag_own_instance(key, value, environ)
        return True

    def add_cli_arguments(self, parser: Any) -> None:
        group = parser.add_argument_group("ec2 provider (see docs/aws.md)")
        group.add_argument(
            "--region",
            default=None,
            help="ec2: region of the subnets (default: $AWS_REGION / $AWS_DEFAULT_REGION)",
        )
        group.add_argument(
            "--endpoint-url",
            default=None,
            help="ec2: EC2/S3/SQS endpoint (an emulator such as moto; default: AWS)",
        )
        group.add_argument(
            "--subnets",
            default=None,
            help="ec2: comma-separated subnet ids, one per availability zone to use",
        )
        group.add_argument(
            "--instance-types",
            default=None,
            help="ec2: comma-separated instance types, e.g. g5.xlarge,g4dn.xlarge",
        )
        group.add_argument(
            "--image-id", default=None, help="ec2: AMI with spot-pipelines installed"
        )
        group.add_argument(
            "--instance-profile",
            default=None,
            help="ec2: IAM instance "
            "profile (name or ARN) that gives the step access to the "
            "checkpoint bucket",
        )
        group.add_argument(
            "--ec2-option",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help='ec2: any other Ec2Provider option, e.g. launch_mode="fleet" '
            "or security_group_ids='[\"sg-1\"]' (repeatable)",
        )

    def cli_options(self, args: Any) -> dict[str, Any]:
        options = key_values(args.ec2_option, "--ec2-option")
        missing = [
            flag
            for flag, value in (
                ("--subnets", args.subnets),
                ("--instance-types", args.instance_types),
                ("--image-id", args.image_id),
            )
            if not value
        ]
        if missing:
            raise ConfigError(
                f"--provider {self.name} needs {', '.join(missing)} (see docs/aws.md)"
            )
        if args.endpoint_url:
            os.environ.setdefault("SPOT_S3_ENDPOINT_URL", args.endpoint_url)
        return {
            "region": args.region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION"),
            "endpoint_url": args.endpoint_url,
            "subnets": _words(args.subnets),
            "instance_types": _words(args.instance_types),
            "image_id": args.image_id,
            "instance_profile": args.instance_profile,
            **options,
        }


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


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
