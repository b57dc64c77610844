"""The ec2 provider's options: ``Ec2Options`` from plain JSON-able values, and the checks
an engine runs on them before anything opens (names, required values, prices, and the
step's environment, which goes into user-data)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from spot_core.credentials import credential_findings
from spot_core.errors import ConfigError
from spot_core.providers.ec2_bootstrap import Bootstrap

CLOUD = "aws"
TAG_MANAGED = "spot-pipelines:managed"
TAG_JOB = "spot-pipelines:job"
TAG_ATTEMPT = "spot-pipelines:attempt"


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
