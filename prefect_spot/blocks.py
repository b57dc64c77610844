"""Blocks: the spot configuration and the checkpoint storage, saved and loaded by name.

    aws = AwsCredentials.load("ml-account")        # prefect-aws, saved once
    SpotConfiguration(provider="ec2", aws_credentials=aws, ...).save("training-spot")
    CheckpointStorage(uri="s3://ckpt-bucket/jobs", aws_credentials=aws).save("training-ckpt")
    SpotTaskRunner(config="training-spot", checkpoint_storage="training-ckpt")

    cluster = KubernetesClusterConfig.load("ml-cluster")  # prefect-kubernetes, saved once
    SpotConfiguration(provider="kubernetes", cluster_config=cluster, ...).save("k8s-spot")

A saved ``AwsCredentials`` or ``KubernetesClusterConfig`` block nested in a saved block
is stored as a reference to it, so its secrets live in that one block document and
nowhere else.

Field descriptions are what the Prefect UI shows in the block form. Bad values raise
``ValueError`` (pydantic ``ValidationError``) with a message that says what to fix.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prefect.blocks.core import Block
from prefect_aws import AwsCredentials
from prefect_kubernetes.credentials import KubernetesClusterConfig
from pydantic import Field, field_validator, model_validator

from prefect_spot._settings import ProviderName, normalise, settings_of, spot_field
from prefect_spot.credentials import aws_access, check_cluster_config, kubernetes_api_client
from spot_core.checkpoint import CheckpointStore, open_store, parse_store_uri
from spot_core.errors import ConfigError
from spot_core.policy.retry import RetryPolicy
from spot_core.settings import BLOCK, SpotSettings, knobs_for

AWS_FIELD_HELP = (
    "A saved prefect-aws AwsCredentials block (keys, or a profile that "
    "may assume a role; region; endpoint in its client parameters) used "
    "for {what}. Empty: boto3's default chain on the machine that runs "
    "the work (environment, profile, instance role)."
)


CLUSTER_FIELD_HELP = (
    "A saved prefect-kubernetes KubernetesClusterConfig block (a "
    "kubeconfig's contents and its context) for the kubernetes provider's "
    "cluster: it creates, watches and deletes the step pods with it. "
    "Then provider_options hold no kubeconfig, context or in_cluster. "
    "Empty: those options, else $KUBECONFIG, ~/.kube/config or the "
    "service account of the pod that runs the work."
)


def aws_field(what: str) -> Any:
    return Field(default=None, description=AWS_FIELD_HELP.format(what=what))


def cluster_field() -> Any:
    return Field(default=None, title="Kubernetes Cluster Config", description=CLUSTER_FIELD_HELP)


# The knobs a SpotConfiguration holds: the settings model's BLOCK surface.
BLOCK_FIELDS = {k.name for k in knobs_for(BLOCK)}


class SpotConfiguration(Block):
    """Where spot work runs and how it recovers: pools, price cap, budgets, fallback,
    timeouts, a deadline and its policy. Each field is a knob of ``spot_core.settings``
    (default, help, check; ``deadline``, ``work`` and ``restart_overhead`` count in the
    provider's capacity time, as that module's docstring says)."""

    _block_type_name = "Spot Configuration"
    _block_type_slug = "spot-configuration"
    _description = (
        "Spot capacity for ML pipeline steps: pool diversification, max price, "
        "preemption budget and on-demand fallback."
    )

    provider: ProviderName = spot_field("provider")
    provider_options: dict[str, Any] = spot_field("provider_options")
    zones: list[str] = spot_field("zones")
    instance_types: list[str] = spot_field("instance_types")
    max_spot_price: float | None = spot_field("max_spot_price")
    max_preemptions: int = spot_field("max_preemptions")
    on_demand_fallback: bool = spot_field("on_demand_fallback")
    return_to_spot: bool = spot_field("return_to_spot")
    min_on_demand: float = spot_field("min_on_demand")
    capacity_wait: float = spot_field("capacity_wait")
    max_capacity_waits: int = spot_field("max_capacity_waits")
    max_infrastructure_retries: int = spot_field("max_infrastructure_retries")
    max_disruptions: int = spot_field("max_disruptions")
    deadline: float | datetime | None = spot_field("deadline")
    work: float | None = spot_field("work")
    total_steps: int | None = spot_field("total_steps")
    restart_overhead: float = spot_field("restart_overhead")
    deadline_policy: str | None = spot_field("deadline_policy")
    attempt_timeout: float = spot_field("attempt_timeout")
    poll_interval: float = spot_field("poll_interval")
    heartbeat_timeout: float = spot_field("heartbeat_timeout")
    heartbeat_uri: str | None = spot_field("heartbeat_uri")
    take_over: bool = spot_field("take_over")
    handover: str | None = spot_field("handover")
    observe_failure_timeout: float = spot_field("observe_failure_timeout")
    alert_interruption_rate: float | None = spot_field("alert_interruption_rate")
    alert_spot_price: float | None = spot_field("alert_spot_price")
    aws_credentials: AwsCredentials | None = aws_field(
        "EC2 (launch, observe, price history), SQS and the jobs' S3 checkpoint stores"
    )
    cluster_config: KubernetesClusterConfig | None = cluster_field()

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        data = normalise(data, BLOCK_FIELDS, "SpotConfiguration")
        refuse_unknown(data, cls.model_fields, "SpotConfiguration")
        return data

    @model_validator(mode="after")
    def _check_settings(self) -> SpotConfiguration:
        check_cluster_config(
            self.provider, self.provider_options, self.cluster_config, "SpotConfiguration"
        )
        self.settings()  # the provider's option check, and cross-field rules
        return self

    def settings(self) -> SpotSettings:
        """These values as the settings model (validated)."""
        return settings_of(self, BLOCK_FIELDS, "SpotConfiguration")

    def retry_policy(self, max_user_retries: int = 0) -> RetryPolicy:
        return self.settings().retry_policy(max_user_retries=max_user_retries)

    def controller_options(self) -> dict[str, Any]:
        return self.settings().controller_options()

    def aws_session(self):
        """The credentials block as spot_core's ``AwsAccess`` (None: boto3's chain)."""
        return aws_access(self.aws_credentials)

    def kubernetes_client(self):
        """The cluster block as a ``kubernetes`` ApiClient (None: the provider's kubeconfig
        options or the default kubeconfig)."""
        return kubernetes_api_client(self.cluster_config)


class CheckpointStorage(Block):
    """A durable checkpoint store (`file:///abs/path` or `s3://bucket/prefix`)."""

    _block_type_name = "Spot Checkpoint Storage"
    _block_type_slug = "spot-checkpoint-storage"
    _description = "Where spot jobs write their checkpoints; every attempt resumes from here."

    uri: str = Field(
        description="Store location: `file:///absolute/path` or "
        "`s3://bucket/prefix`. Each job gets its own folder under it."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for S3 stores (`endpoint_url`, `region`, `sse`, ...).",
    )
    aws_credentials: AwsCredentials | None = aws_field("an s3:// store")

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        try:
            return parse_store_uri(value).uri
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc

    @model_validator(mode="after")
    def _check_options(self) -> CheckpointStorage:
        check_store_options(self.uri, self.options)
        return self

    def job_uri(self, job_key: str) -> str:
        """The store URI of one job under this storage."""
        return f"{self.uri.rstrip('/')}/{job_key}"

    def open(self, job_key: str | None = None) -> CheckpointStore:
        uri = self.uri if job_key is None else self.job_uri(job_key)
        return self.open_uri(uri)

    def open_uri(self, uri: str) -> CheckpointStore:
        """A store under this storage, with its options and credentials."""
        return open_store(uri, session=self.aws_session(), **self.options)

    def aws_session(self):
        """The credentials block as spot_core's ``AwsAccess`` (None: boto3's chain)."""
        return aws_access(self.aws_credentials)


# The S3 backend's options a block may set; credentials never (they would be saved in
# the block document in plain sight: use aws_credentials, a profile or an instance role).
S3_STORE_OPTIONS = (
    "endpoint_url",
    "region",
    "sse",
    "sse_kms_key_id",
    "part_size",
    "max_concurrency",
    "lock_ttl",
    "lock_timeout",
)


def refuse_unknown(data: Any, fields: Any, where: str) -> None:
    """A misspelt field is refused in one line, not silently dropped."""
    if not isinstance(data, dict):
        return
    unknown = sorted(k for k in data if not str(k).startswith("_") and k not in fields)
    if unknown:
        known = sorted(k for k in fields if not k.startswith("_"))
        raise ValueError(f"{where}: unknown field(s) {unknown}; choose from {known}")


def check_store_options(uri: str, options: dict[str, Any]) -> None:
    """Options only for s3:// stores, only the S3 backend's, and no credentials."""
    if not options:
        return
    if not uri.startswith("s3://"):
        raise ValueError(
            f"options {sorted(options)} apply to s3:// stores only; {uri} is a "
            "file store: remove them"
        )
    unknown = sorted(set(options) - set(S3_STORE_OPTIONS))
    if any(
        "key" in k.lower()
        and k != "sse_kms_key_id"
        or "secret" in k.lower()
        or "token" in k.lower()
        or "password" in k.lower()
        for k in unknown
    ):
        raise ValueError(
            f"CheckpointStorage options {unknown} look like credentials, which "
            "would be saved in the block in plain text: give them through "
            "aws_credentials (a saved AwsCredentials block), an AWS profile or "
            "an instance role"
        )
    if unknown:
        raise ValueError(
            f"unknown CheckpointStorage option(s) {unknown}; choose from {list(S3_STORE_OPTIONS)}"
        )


def _one_line(exc: Exception) -> str:
    """A pydantic ValidationError's first message, without the pydantic boilerplate."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return str(first.get("ctx", {}).get("error") or first.get("msg"))
    return str(exc)


def resolve_config(value: SpotConfiguration | str | None) -> SpotConfiguration:
    """A SpotConfiguration from an instance, a saved block's name, or the defaults."""
    if value is None:
        return SpotConfiguration()
    if isinstance(value, str):
        # Prefect's async_dispatch types load() as maybe a coroutine; called from sync
        # code (as here) it returns the block
        return SpotConfiguration.load(value)  # type: ignore[return-value]
    return value


def check_config_argument(value: Any, where: str) -> None:
    """``config=`` is a SpotConfiguration, a saved block's name, or None."""
    if value is None or isinstance(value, SpotConfiguration):
        return
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{where} config={value!r} must be a SpotConfiguration, the name of "
            "a saved one, or None for the defaults"
        )


def storage_from_uri(value: Any, where: str) -> CheckpointStorage | None:
    """``checkpoint_storage=`` checked where it is given: a CheckpointStorage, a store URI
    (parsed now, one line if bad), a block name (loaded on use) or None."""
    if value is None or isinstance(value, CheckpointStorage):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{where} checkpoint_storage={value!r} must be a CheckpointStorage, "
            "a saved block's name, or a store URI (file:///abs/path, "
            "s3://bucket/prefix)"
        )
    if "://" not in value:
        return None  # a block name: loaded when the job runs
    try:
        return CheckpointStorage(uri=value)
    except ValueError as exc:
        raise ConfigError(f"{where} checkpoint_storage: {_one_line(exc)}") from None


def resolve_storage(value: CheckpointStorage | str | None) -> CheckpointStorage | None:
    """A CheckpointStorage from an instance, a block name or a store URI."""
    if value is None or isinstance(value, CheckpointStorage):
        return value
    if "://" in value:
        return storage_from_uri(value, "checkpoint_storage")
    return CheckpointStorage.load(value)  # type: ignore[return-value]  # as in resolve_config
