"""Blocks: the spot configuration and the checkpoint storage, saved and loaded by name.

    SpotConfiguration(max_preemptions=2, zones=["us-east-2a"]).save("training-spot")
    CheckpointStorage(uri="s3://ckpt-bucket/jobs").save("training-ckpt")
    SpotTaskRunner(config="training-spot", checkpoint_storage="training-ckpt")

Field descriptions are what the Prefect UI shows in the block form. Bad values raise
``ValueError`` (pydantic ``ValidationError``) with a message that says what to fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from prefect.blocks.core import Block

from spot_core.checkpoint import CheckpointStore, open_store, parse_store_uri
from spot_core.errors import ConfigError
from spot_core.policy.retry import RetryPolicy

from prefect_spot._options import check_provider_options

PROVIDERS = ("local", "ec2")  # kubernetes plugs in here when its provider lands


class SpotConfiguration(Block):
    """Where spot work runs and how it recovers: pools, price cap, budgets, fallback."""

    _block_type_name = "Spot Configuration"
    _block_type_slug = "spot-configuration"
    _description = ("Spot capacity for ML pipeline steps: pool diversification, max price, "
                    "preemption budget and on-demand fallback.")

    provider: Literal["local", "ec2"] = Field(
        default="local", description="Capacity provider. `local` is the trace-driven local "
        "spot cloud (no cloud account needed); `ec2` is AWS EC2 (needs an `s3://` "
        "checkpoint storage).")
    provider_options: dict[str, Any] = Field(
        default_factory=dict, description="Options for the provider, e.g. for `local`: "
        "`url` of a running local cloud server, or `time_scale` and `start_tick` for an "
        "in-process one; for `ec2`: `region`, `subnets`, `image_id`, `instance_types`, "
        "`instance_profile`, `agent_python` (the Python on the instance, default "
        "`python3`), `endpoint_url`, ... (never credentials).")
    zones: list[str] = Field(
        default_factory=list, description="Zones to spread over (pool diversification). "
        "Empty: every zone the provider offers.")
    instance_types: list[str] = Field(
        default_factory=list, description="Instance types allowed. Empty: every type the "
        "provider offers.")
    max_price_per_hour: float | None = Field(
        default=None, gt=0, description="Highest spot price (USD/hour) to pay; dearer spot "
        "pools count as having no capacity. Empty: no cap.")
    max_preemptions: int = Field(
        default=3, ge=0, description="Preemption budget: after this many preemptions the "
        "job runs on on-demand (if fallback is on). Never consumes the task's retries.")
    on_demand_fallback: bool = Field(
        default=True, description="Run on on-demand when spot is exhausted or scarce.")
    return_to_spot: bool = Field(
        default=True, description="Move back to spot when capacity returns (within the "
        "preemption budget).")
    min_on_demand_seconds: float = Field(
        default=600.0, ge=0, description="Capacity seconds an on-demand attempt runs before "
        "the job may move back to spot.")
    capacity_wait_seconds: float = Field(
        default=5.0, gt=0, description="Seconds to wait between launches when no pool has "
        "capacity.")
    max_capacity_waits: int = Field(
        default=20, ge=1, description="How many such waits before the job fails.")
    max_infrastructure_retries: int = Field(
        default=3, ge=0, description="Attempts lost to infrastructure failures (not "
        "preemptions, not the step's own errors) before the job fails.")
    poll_interval_seconds: float = Field(
        default=0.1, gt=0, description="How often a running lease is observed.")

    @model_validator(mode="after")
    def _check_policy(self) -> SpotConfiguration:
        self.retry_policy()  # RetryPolicy re-validates and names the bad field
        try:
            check_provider_options(self.provider, self.provider_options, self.instance_types)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return self

    def retry_policy(self, max_user_retries: int = 0) -> RetryPolicy:
        try:
            return RetryPolicy(
                max_preemptions=self.max_preemptions, max_user_retries=max_user_retries,
                max_infrastructure_retries=self.max_infrastructure_retries,
                on_demand_fallback=self.on_demand_fallback, return_to_spot=self.return_to_spot,
                capacity_wait_seconds=self.capacity_wait_seconds,
                max_capacity_waits=self.max_capacity_waits,
                min_on_demand_seconds=self.min_on_demand_seconds)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc


class CheckpointStorage(Block):
    """A durable checkpoint store (`file:///abs/path` or `s3://bucket/prefix`)."""

    _block_type_name = "Spot Checkpoint Storage"
    _block_type_slug = "spot-checkpoint-storage"
    _description = "Where spot jobs write their checkpoints; every attempt resumes from here."

    uri: str = Field(description="Store location: `file:///absolute/path` or "
                     "`s3://bucket/prefix`. Each job gets its own folder under it.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options for S3 stores (`endpoint_url`, `region`, "
        "`sse`, ...).")

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        try:
            return parse_store_uri(value).uri
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc

    def job_uri(self, job_key: str) -> str:
        """The store URI of one job under this storage."""
        return f"{self.uri.rstrip('/')}/{job_key}"

    def open(self, job_key: str | None = None) -> CheckpointStore:
        uri = self.uri if job_key is None else self.job_uri(job_key)
        return open_store(uri, **self.options)


def resolve_config(value: SpotConfiguration | str | None) -> SpotConfiguration:
    """A SpotConfiguration from an instance, a saved block's name, or the defaults."""
    if value is None:
        return SpotConfiguration()
    if isinstance(value, str):
        return SpotConfiguration.load(value)
    return value


def resolve_storage(value: CheckpointStorage | str | None) -> CheckpointStorage | None:
    """A CheckpointStorage from an instance, a block name or a store URI."""
    if value is None or isinstance(value, CheckpointStorage):
        return value
    if "://" in value:
        return CheckpointStorage(uri=value)
    return CheckpointStorage.load(value)
