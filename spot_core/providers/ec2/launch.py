"""Launching: one instance with ``run_instances``, or an ``instant`` fleet over the
subnets of one pool (``launch``) or of several pools of a region (``launch_any``); a launch
cut short terminates what it made, found by its tags."""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spot_core import attempt_env, container
from spot_core.adaptors import aws
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.model import Lease, Market, Pool
from spot_core.providers import ec2_agent
from spot_core.providers.base import LaunchSpec
from spot_core.providers.ec2.instances import Ec2Instances
from spot_core.providers.ec2.options import (
    CLOUD,
    TAG_ATTEMPT,
    TAG_JOB,
    TAG_MANAGED,
    refuse_credentials_in_env,
)
from spot_core.providers.ec2_bootstrap import Bootstrap

log = logging.getLogger(__name__)

GB = 1 << 30


class Ec2Launch(Ec2Instances):
    """``launch`` and ``launch_any`` of ``Ec2Provider``."""

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
