"""The spot worker's schema: its job configuration and variables (the work pool's form),
each field a knob of ``spot_core.settings`` checked as the settings check it, and the
result a flow run leaves the worker with."""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any

from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorkerResult
from prefect_aws import AwsCredentials
from prefect_kubernetes.credentials import KubernetesClusterConfig
from pydantic import BaseModel, Field, field_validator, model_validator

from prefect_spot import _jobs
from prefect_spot._settings import ProviderName, normalise, settings_of, spot_field
from prefect_spot.blocks import AWS_FIELD_HELP, BLOCK_FIELDS, CLUSTER_FIELD_HELP, SpotConfiguration
from prefect_spot.credentials import check_cluster_config
from spot_core import jobs
from spot_core.checkpoint import parse_store_uri
from spot_core.errors import ConfigError
from spot_core.model import JobRecord
from spot_core.settings import WORKER, knobs_for


def _check_store_uri(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    try:
        return parse_store_uri(value).uri
    except ConfigError as exc:
        raise ValueError(f"checkpoint_root: {exc}") from exc


WORKER_FIELDS = {k.name for k in knobs_for(WORKER)}


def _check_settings(values):
    """The settings model's checks (the provider's options without touching the cloud);
    a remote provider needs an ``s3://`` checkpoint_root (its instances cannot see the
    worker's disk); a cluster block only on kubernetes, instead of kubeconfig options."""
    check_cluster_config(
        values.provider, values.provider_options, values.cluster_config, "spot worker"
    )
    settings_of(values, WORKER_FIELDS, "spot worker")
    try:
        _jobs.check_store_for(
            values.provider, values.checkpoint_root, "checkpoint_root", values.provider_options
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    return values


class _SpotFields:
    """Field definitions shared by the variables (the UI form) and the job configuration:
    each a knob of ``spot_core.settings`` (its default and help), plus checkpoint_root."""

    provider = spot_field("provider")
    provider_options = spot_field("provider_options")
    zones = spot_field("zones")
    instance_types = spot_field("instance_types")
    max_spot_price = spot_field("max_spot_price")
    max_preemptions = spot_field("max_preemptions")
    on_demand_fallback = spot_field("on_demand_fallback")
    return_to_spot = spot_field("return_to_spot")
    min_on_demand = spot_field("min_on_demand")
    capacity_wait = spot_field("capacity_wait")
    max_capacity_waits = spot_field("max_capacity_waits")
    max_infrastructure_retries = spot_field("max_infrastructure_retries")
    max_disruptions = spot_field("max_disruptions")
    deadline = spot_field("deadline")
    work = spot_field("work")
    total_steps = spot_field("total_steps")
    restart_overhead = spot_field("restart_overhead")
    deadline_policy = spot_field("deadline_policy")
    attempt_timeout = spot_field("attempt_timeout")
    poll_interval = spot_field("poll_interval")
    heartbeat_timeout = spot_field("heartbeat_timeout")
    heartbeat_uri = spot_field("heartbeat_uri")
    take_over = spot_field("take_over")
    handover = spot_field("handover")
    observe_failure_timeout = spot_field("observe_failure_timeout")
    alert_interruption_rate = spot_field("alert_interruption_rate")
    alert_spot_price = spot_field("alert_spot_price")
    # As prefect-aws' ECS worker: an empty block (the default) is boto3's default chain.
    aws_credentials = Field(
        default_factory=AwsCredentials,
        title="AWS Credentials",
        description=AWS_FIELD_HELP.format(
            what="EC2, SQS and the checkpoint_root store; in a "
            "deployment's job variables reference the saved block "
            '(`{"$ref": {"block_document_id": ...}}`), never its keys'
        ),
    )
    # As prefect-kubernetes' worker (its `cluster_config`): empty is the default kubeconfig.
    cluster_config = Field(
        default=None,
        title="Kubernetes Cluster Config",
        description=CLUSTER_FIELD_HELP + " In a deployment's job "
        'variables reference the saved block (`{"$ref": '
        '{"block_document_id": ...}}`), never its kubeconfig.',
    )
    checkpoint_root = Field(
        default=None,
        description="Checkpoint store (`file:///abs/path` "
        "or `s3://bucket/prefix`); each flow run gets a folder, passed "
        "to it as SPOT_CHECKPOINT_URI. Empty: a folder on the worker "
        "(local provider only; `ec2` needs `s3://`, `kubernetes` `s3://` "
        "or a path on a volume its pod_template mounts).",
    )


class _SpotValues(BaseModel):
    """The spot fields, their checks and the SpotConfiguration they make (a mixin of the
    job configuration and the variables)."""

    provider: ProviderName = _SpotFields.provider
    provider_options: dict[str, Any] = _SpotFields.provider_options
    zones: list[str] = _SpotFields.zones
    instance_types: list[str] = _SpotFields.instance_types
    max_spot_price: float | None = _SpotFields.max_spot_price
    max_preemptions: int = _SpotFields.max_preemptions
    on_demand_fallback: bool = _SpotFields.on_demand_fallback
    return_to_spot: bool = _SpotFields.return_to_spot
    min_on_demand: float = _SpotFields.min_on_demand
    capacity_wait: float = _SpotFields.capacity_wait
    max_capacity_waits: int = _SpotFields.max_capacity_waits
    max_infrastructure_retries: int = _SpotFields.max_infrastructure_retries
    max_disruptions: int = _SpotFields.max_disruptions
    deadline: float | datetime | None = _SpotFields.deadline
    work: float | None = _SpotFields.work
    total_steps: int | None = _SpotFields.total_steps
    restart_overhead: float = _SpotFields.restart_overhead
    deadline_policy: str | None = _SpotFields.deadline_policy
    attempt_timeout: float = _SpotFields.attempt_timeout
    poll_interval: float = _SpotFields.poll_interval
    heartbeat_timeout: float = _SpotFields.heartbeat_timeout
    heartbeat_uri: str | None = _SpotFields.heartbeat_uri
    take_over: bool = _SpotFields.take_over
    handover: str | None = _SpotFields.handover
    observe_failure_timeout: float = _SpotFields.observe_failure_timeout
    alert_interruption_rate: float | None = _SpotFields.alert_interruption_rate
    alert_spot_price: float | None = _SpotFields.alert_spot_price
    checkpoint_root: str | None = _SpotFields.checkpoint_root
    aws_credentials: AwsCredentials = _SpotFields.aws_credentials
    cluster_config: KubernetesClusterConfig | None = _SpotFields.cluster_config

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        return normalise(data, WORKER_FIELDS, "spot worker")

    _check_root = field_validator("checkpoint_root")(
        classmethod(lambda cls, value: _check_store_uri(value))
    )
    _check_fields = model_validator(mode="after")(lambda self: _check_settings(self))

    def spot_configuration(self) -> SpotConfiguration:
        return SpotConfiguration(
            **{name: getattr(self, name) for name in BLOCK_FIELDS},
            aws_credentials=self.aws_credentials,
            cluster_config=self.cluster_config,
        )


class SpotJobConfiguration(_SpotValues, BaseJobConfiguration):
    def prepare_for_flow_run(
        self, flow_run, deployment=None, flow=None, work_pool=None, worker_name=None, worker_id=None
    ) -> None:
        # Prefect's engine in the lease's main process, so a spot_task can turn the
        # notice's SIGTERM into an emergency checkpoint, and end a preempted run without
        # a final state (prefect_spot._engine).
        # On a remote lease (ec2) the instance's own Python runs it (`agent_python`).
        python = jobs.provider_plugin(self.provider).lease_python(self.provider_options)
        self.command = self.command or f"{shlex.quote(python)} -m prefect_spot._engine"
        super().prepare_for_flow_run(flow_run, deployment, flow, work_pool, worker_name, worker_id)


class SpotJobVariables(_SpotValues, BaseVariables):
    pass


class SpotWorkerResult(BaseWorkerResult):
    """The lease of the last attempt, its exit code, and the job's record summary."""

    record: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: JobRecord, lease_id: str | None, status_code: int = 0) -> SpotWorkerResult:
        """The result of a flow run leaving the worker with ``record``: ``lease_id`` (the
        attempt's, None for none) is its infrastructure id."""
        return cls(identifier=lease_id or "", status_code=status_code, record=record.summary())
