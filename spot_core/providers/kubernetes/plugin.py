"""``KubernetesPlugin``: what the engines know of the kubernetes provider (its
capabilities, session, stores, command-line flags), and ``annotate_own_pod``, how a lease
publishes a value from inside its own pod."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spot_core.adaptors import kubernetes as k8s
from spot_core.errors import ConfigError
from spot_core.policy import pod_outcomes as classify
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import Provider, ProviderPlugin, SessionKind, key_values
from spot_core.providers.kubernetes.options import (
    KubernetesOptions,
    check_option_names,
    check_option_value,
)
from spot_core.providers.kubernetes.provider import KubernetesProvider


class KubernetesPlugin(ProviderPlugin):
    """Pods on a cluster's spot node pools, reached with a ``kubernetes`` ApiClient."""

    capabilities = KubernetesProvider.capabilities
    session = SessionKind.KUBERNETES
    summary = (
        "pods on a Kubernetes cluster's spot node pools (a store its pods reach: "
        "s3://, or a volume every pod mounts)"
    )
    lease_noun = "pods"
    step_container = classify.STEP_CONTAINER
    store_hint = (
        "'s3://bucket/prefix', or a file:// path under a volumeMount of the "
        "pod_template's step container (a PVC every pod mounts)"
    )

    def open(self, options: Mapping[str, Any], session: Any = None) -> Provider:
        """``session``: an ApiClient the engine resolved (an Airflow ``kubernetes_conn_id``,
        a Prefect ``KubernetesClusterConfig``); None: the kubeconfig options."""
        if session is None:
            return KubernetesProvider.from_options(**options)
        return KubernetesProvider(
            KubernetesOptions.from_plain(**options), api=k8s.core_api(session)
        )

    def check_options(self, options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
        """Every name a kubernetes option, each value of its type (no API call). Pools come
        from the cluster's node labels, so ``instance_types`` is not needed."""
        check_option_names(options)
        for name, value in options.items():
            check_option_value(name, value)

    def reaches_store(self, uri: str | None, options: Mapping[str, Any]) -> bool:
        return pods.mounted_store(uri, options.get("pod_template"))

    def publish_from_lease(self, key: str, value: str, environ: Mapping[str, str]) -> bool:
        """In one of its pods (the downward API names it): an annotation on the pod."""
        from spot_core.interruption.kubernetes import POD_NAME_ENV

        if not environ.get(POD_NAME_ENV):
            return False
        annotate_own_pod(key, value, environ)
        return True

    def add_cli_arguments(self, parser: Any) -> None:
        group = parser.add_argument_group("kubernetes provider (see docs/kubernetes.md)")
        group.add_argument(
            "--kubeconfig",
            default=None,
            help="kubernetes: kubeconfig file "
            "(default: $KUBECONFIG or ~/.kube/config; in a pod: its service "
            "account)",
        )
        group.add_argument("--context", default=None, help="kubernetes: kubeconfig context")
        group.add_argument(
            "--namespace",
            default=None,
            help="kubernetes: namespace of the step pods (default: default)",
        )
        group.add_argument(
            "--k8s-option",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help="kubernetes: any other provider option, e.g. "
            'image="reg/step:1" or prices=\'{"spot-ng": {"spot": 0.07}}\' '
            "(repeatable)",
        )

    def cli_options(self, args: Any) -> dict[str, Any]:
        from spot_core.providers.registry import refuse_credentials

        options = key_values(args.k8s_option, "--k8s-option")
        for name in ("kubeconfig", "context", "namespace"):
            if getattr(args, name):
                options[name] = getattr(args, name)
        refuse_credentials(options)
        self.check_options(options, ())
        return options


def annotate_own_pod(key: str, value: str, environ: Mapping[str, str] | None = None) -> str:
    """Set annotation ``key`` on the pod this runs in (named by the downward API's
    ``SPOT_POD_NAME`` / ``SPOT_POD_NAMESPACE``) with the pod's own credentials; the pod's
    name. The admission policy in deploy/kubernetes/rbac.yaml lets a step's service
    account patch only its own pod, so no other pod can set this annotation there."""
    import os

    from spot_core.interruption.kubernetes import POD_NAME_ENV, POD_NAMESPACE_ENV

    env = os.environ if environ is None else environ
    name, namespace = env.get(POD_NAME_ENV), env.get(POD_NAMESPACE_ENV)
    if not name or not namespace:
        raise ConfigError(
            f"annotate_own_pod needs ${POD_NAME_ENV} and ${POD_NAMESPACE_ENV} "
            "(the kubernetes provider sets them from the downward API)"
        )
    api = k8s.core_api(k8s.api_client())
    k8s.call(
        f"annotate pod {name} (its own)",
        api.patch_namespaced_pod,
        name,
        namespace,
        {"metadata": {"annotations": {key: value}}},
    )
    return name
