"""Airflow connections -> what spot_core takes to reach a cloud, resolved in each process.

Airflow users keep credentials in connections; spot_core takes a session object and
never reads them from its options. So a spot task names a connection by id
(``aws_conn_id``, ``kubernetes_conn_id``), and every process that opens the provider
(the worker that launches, the triggerer that watches, the sensor) resolves that id
itself through the provider packages' own hooks:

- ``aws_access``: the amazon provider's ``AwsBaseHook``: its session (keys, profile or a
  role it assumes and refreshes, from the connection and its extra), its region
  (``region_name``) and its endpoints (``endpoint_url``, per-service
  ``service_config``), as a ``spot_core.adaptors.aws.AwsAccess``.
- ``kubernetes_client``: cncf-kubernetes' ``KubernetesHook``: a ``kubernetes`` API client
  built from the connection (in-cluster, kubeconfig path or inline kubeconfig, context).

Only the id travels (trigger kwargs, the task's fields); the connection itself comes
from a secrets backend or ``AIRFLOW_CONN_<ID>``, which every component that runs spot
tasks needs (worker and triggerer alike).
"""

from __future__ import annotations

from typing import Any

from spot_core.adaptors.aws import AwsAccess, kept_access

AWS_SERVICES = ("ec2", "s3", "sqs")  # what spot_core calls with an AwsAccess


class ConnectionMissing(ValueError):
    """The connection id names no connection this process can see."""


def check_conn_id(value: Any, name: str, where: str) -> None:
    """A connection id is None or a non-empty string without spaces (parse time)."""
    if value is None:
        return
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ValueError(
            f"{where}: {name}={value!r} must be an Airflow connection id such as "
            f"'aws_default', or None"
        )


def _require(conn_id: str, kind: str) -> Any:
    """The connection; fails in one line when the id is unknown here, rather than fall
    back silently to other credentials (the amazon hook only warns)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConnectionMissing(
            f"{kind} connection {conn_id!r} is not defined in this process; define it in "
            f"a secrets backend or as AIRFLOW_CONN_{conn_id.upper()} in every Airflow "
            "component that runs spot tasks (workers and the triggerer)"
        ) from None


def aws_access(conn_id: str) -> AwsAccess:
    """The session, region and endpoints of AWS connection ``conn_id``.

    One per process while the connection stays the same (``aws.kept_access``, keyed by
    its id and its fields), so every trigger and store of a triggerer shares one session
    and its clients rather than build a session per trigger; an edited connection
    (rotated keys) gets a new one."""
    connection = _require(conn_id, "AWS")
    fields = [
        getattr(connection, name, None)
        for name in ("conn_type", "host", "login", "password", "schema", "port", "extra")
    ]
    return kept_access(f"airflow connection {conn_id}", fields, lambda: _new_aws_access(conn_id))


def _new_aws_access(conn_id: str) -> AwsAccess:
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="ec2")
    config = hook.conn_config
    endpoints = {service: config.get_service_endpoint_url(service) for service in AWS_SERVICES}
    return AwsAccess(
        session=hook.get_session(region_name=config.region_name),
        region=config.region_name,
        endpoint_url=config.endpoint_url,
        service_endpoints={s: url for s, url in endpoints.items() if url},
        verify=config.verify,
    )


def kubernetes_client(conn_id: str) -> Any:
    """The ``kubernetes.client.ApiClient`` of Kubernetes connection ``conn_id``."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    _require(conn_id, "Kubernetes")
    return KubernetesHook(conn_id=conn_id).get_conn()
