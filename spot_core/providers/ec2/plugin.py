"""``Ec2Plugin``: what the engines and the command line know of the ec2 provider (its
option checks and defaults, its flags, how a lease publishes a value); the entry point
``ec2 = "spot_core.providers.ec2:Ec2Plugin"`` reaches it through the package."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core import attempt_env
from spot_core.adaptors import aws
from spot_core.errors import ConfigError
from spot_core.model import Lease
from spot_core.providers import ec2_agent
from spot_core.providers.base import Provider, ProviderPlugin, SessionKind, key_values
from spot_core.providers.ec2.options import (
    CLOUD,
    _check_on_demand_prices,
    check_option_names,
    refuse_credentials_in_env,
)
from spot_core.providers.ec2.provider import Ec2Provider
from spot_core.providers.ec2_bootstrap import Bootstrap

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
