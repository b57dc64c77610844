"""Prefect blocks -> what spot_core takes to reach AWS or a Kubernetes cluster, resolved
where the work runs.

Prefect users keep AWS credentials in a prefect-aws ``AwsCredentials`` block and cluster
credentials in a prefect-kubernetes ``KubernetesClusterConfig`` block (a kubeconfig's
contents and a context name); spot_core takes a session object and never reads
credentials from its options. A ``SpotConfiguration``, a ``CheckpointStorage`` and the
spot worker's job variables hold the blocks (a saved one by reference), and the process
that opens the provider or the store (the flow run's task runner, the worker) turns them
into what the provider takes here: the AWS block into a ``spot_core.adaptors.aws.AwsAccess``
(its ``get_boto3_session()``: keys, a profile, or the profile's role; its region and its
client parameters' endpoint), the cluster block into a synchronous ``kubernetes``
``ApiClient`` (the block's own ``get_api_client()`` returns a ``kubernetes_asyncio``
client in prefect-kubernetes 0.8, which the provider's synchronous calls cannot use;
its ``config`` and ``context_name`` are read as prefect-kubernetes' own worker reads them).
"""

from __future__ import annotations

import hashlib
from typing import Any

from spot_core import jobs
from spot_core.adaptors.aws import AwsAccess, kept_access
from spot_core.adaptors.kubernetes import api_client_from_dict

# The kubernetes provider's options that say how to reach the cluster: the block's job.
CLUSTER_OPTIONS = ("kubeconfig", "context", "in_cluster")


def aws_access(credentials: Any) -> AwsAccess | None:
    """The ``AwsAccess`` of an ``AwsCredentials`` block; None (boto3's default chain)
    without one.

    One per process for the same block contents (``aws.kept_access``: keys, profile,
    region and client parameters), so every store and provider opened with it shares one
    boto3 session and its clients: a worker watching many flow runs does not build a
    session per store. An edited block gets a new one."""
    if credentials is None:
        return None
    fields = credentials.model_dump(mode="python")
    secrets = {
        name: value.get_secret_value()
        for name, value in fields.items()
        if hasattr(value, "get_secret_value")
    }
    return kept_access(
        f"prefect {type(credentials).__name__}",
        sorted({**fields, **secrets}.items(), key=lambda kv: kv[0]),
        lambda: _new_access(credentials),
    )


def _new_access(credentials: Any) -> AwsAccess:
    params = credentials.aws_client_parameters
    verify = params.verify
    return AwsAccess(
        session=credentials.get_boto3_session(),
        region=credentials.region_name,
        endpoint_url=params.endpoint_url,
        verify=None if verify is None else (verify if isinstance(verify, bool) else str(verify)),
    )


def kubernetes_api_client(cluster_config: Any) -> Any:
    """The synchronous ``ApiClient`` of a ``KubernetesClusterConfig`` block; None (the
    provider's kubeconfig options, ``$KUBECONFIG`` or the pod's service account) without
    one."""
    if cluster_config is None:
        return None
    name = getattr(cluster_config, "_block_document_name", None)
    source = f"cluster_config block {name!r}" if name else "the cluster_config block"
    return api_client_from_dict(cluster_config.config, cluster_config.context_name, source=source)


def check_cluster_config(
    provider: str, provider_options: dict[str, Any], cluster_config: Any, where: str
) -> None:
    """A cluster block is a Kubernetes provider's only way to its cluster when given:
    refused (ValueError, one line) on a provider that takes no Kubernetes session, or
    beside kubeconfig options."""
    if cluster_config is None:
        return
    if jobs.provider_plugin(provider).session is not jobs.SessionKind.KUBERNETES:
        takers = [
            n
            for n in jobs.provider_names()
            if jobs.provider_plugin(n).session is jobs.SessionKind.KUBERNETES
        ]
        choice = " or ".join(f"provider={n!r}" for n in takers) or "a Kubernetes provider"
        raise ValueError(
            f"{where}: cluster_config is a Kubernetes cluster's and provider "
            f"{provider!r} takes none: set {choice} or remove cluster_config"
        )
    given = sorted(set(provider_options or {}) & set(CLUSTER_OPTIONS))
    if given:
        raise ValueError(
            f"{where}: cluster_config and provider_options {given} both say how "
            f"to reach the cluster: remove {given} from provider_options (the "
            "block's kubeconfig and context_name are used)"
        )


def fingerprint(credentials: Any) -> str:
    """An in-memory key telling two blocks apart (providers are cached per credentials:
    AWS or cluster); a digest, so the key itself holds no secret."""
    if credentials is None:
        return ""
    dumped = credentials.model_dump_json(context={"include_secrets": True})
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]
