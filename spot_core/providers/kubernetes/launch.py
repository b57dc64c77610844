"""Launching: the attempt's pod built on ``pool`` (``kubernetes_pods.build_pod``, the
``pod_template`` merged under ours), created, and waited for, bounded, until it is
scheduled and its step container started (an unschedulable pod is a capacity miss, a
container that cannot start for its configuration one ``ConfigError``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core.adaptors import kubernetes as k8s
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.model import Lease, Pool
from spot_core.policy import pod_outcomes as classify
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import LaunchSpec
from spot_core.providers.kubernetes.cluster import KubernetesCluster


class KubernetesLaunch(KubernetesCluster):
    """Launching: the attempt's pod, built from the template, created and waited for."""

    def build_pod(self, spec: LaunchSpec, pool: Pool, name: str | None = None) -> dict[str, Any]:
        """The attempt's pod on ``pool`` as the API's JSON, the ``pod_template`` merged
        under ours (public: the Airflow SpotKubernetesPodOperator builds its pod here)."""
        image = spec.image or self.config.image or pods.template_image(self.config.pod_template)
        if not image:
            raise ConfigError(
                "the kubernetes provider needs the step's image: pass "
                "provider_options {'image': 'registry/step:tag'} (or image=, or "
                "a container image in pod_template)"
            )
        nodes = self.market.pool_nodes(pool)
        return pods.build_pod(
            spec,
            pool,
            name=name or pods.pod_name(spec.job_id, spec.attempt, uuid.uuid4().hex[:5]),
            namespace=self.config.namespace,
            image=image,
            watch_command=self.config.watch_command,
            pod_template=self.config.pod_template,
            service_account=self.config.service_account,
            flavours=nodes.flavours if nodes else (),
            watch_poll_interval=self.config.watch_poll_interval,
            do_not_disrupt=self.config.do_not_disrupt,
        )

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        """The attempt's pod, scheduled and started on ``pool``; see the module docstring."""
        nodes = self.market.refresh(force=True).get(pool.key)
        if nodes is None or not nodes.schedulable_nodes:
            self.market.note_capacity_miss(pool, self.clock())
            raise CapacityUnavailable(f"no schedulable node in {pool.key}")
        body = self.build_pod(spec, pool)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        # Known before the create: a stop landing while the create's answer is still being
        # read (a SIGTERM in `spot-pipelines run`) must delete the pod too, here or in close().
        self._launched[name] = namespace
        try:  # whatever stops us before the lease is handed back also deletes the pod
            k8s.call(f"create pod {name}", self.api.create_namespaced_pod, namespace, body)
            pod = self._wait_started(name, namespace, pool)
            return self._lease(spec, pool, pod, nodes.node_pools)
        except BaseException:
            self._delete_quietly(name, namespace)
            raise

    def _wait_started(self, name: str, namespace: str, pool: Pool) -> dict[str, Any]:
        """Poll the new pod until its step started (or ended); every way out is bounded."""
        started = self.clock()
        while True:
            try:
                pod = k8s.raw(f"get pod {name}", self.api.read_namespaced_pod, name, namespace)
            except k8s.NotFound:  # deleted or evicted before it started: try again elsewhere
                raise InfrastructureError(
                    f"pod {name} was deleted before its step started "
                    "(evicted, or deleted by someone else)"
                ) from None
            problem = classify.waiting_problem(pod)
            if problem is not None:
                raise ConfigError(
                    f"pod {name} cannot start its step: {problem}; fix the "
                    "image, its pull secret or pod_template"
                )
            if _step_started(pod):
                return pod
            waited = self.clock() - started
            if pods.scheduled_at(pod) is None and waited >= self.config.unschedulable_timeout:
                self.market.note_capacity_miss(pool, self.clock())
                why = (pods.unschedulable_since(pod) or (0.0, "not scheduled"))[1]
                raise CapacityUnavailable(
                    f"pod {name} found no node in {pool.key} within "
                    f"{self.config.unschedulable_timeout:g} s ({why})"
                )
            if waited >= self.config.unschedulable_timeout + self.config.start_timeout:
                raise InfrastructureError(
                    f"pod {name} was scheduled but its step did not "
                    f"start within {self.config.start_timeout:g} s"
                )
            self._sleep(0.25)

    def _lease(
        self, spec: LaunchSpec, pool: Pool, pod: Mapping[str, Any], node_pools: Sequence[str]
    ) -> Lease:
        now = self.clock()
        offer = self.market.offers([pool], now)[0]
        name = pod["metadata"]["name"]
        return Lease(
            lease_id=name,
            pool=pool,
            job_id=spec.job_id,
            attempt=spec.attempt,
            started_at=min(now, pods.scheduled_at(pod) or now),
            price_per_hour=offer.price_per_hour,
            details={
                "namespace": pod["metadata"].get("namespace", self.config.namespace),
                "checkpoint_uri": spec.checkpoint_uri,
                "node": classify.node_of(pod) or "",
                "node_pool": ",".join(node_pools),
                "on_demand_price_per_hour": f"{offer.on_demand_price_per_hour:.6f}",
                "labels": pods.job_selector(spec.job_id) + f",{pods.LABEL_ATTEMPT}={spec.attempt}",
            },
        )


def _step_started(pod: Mapping[str, Any]) -> bool:
    """The step's container runs or ran (or the pod already ended)."""
    if (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    state = pods.step_state(pod).get("state") or {}
    return bool(state.get("running") or state.get("terminated"))
