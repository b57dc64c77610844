"""``SpotKubernetesPodOperator``: a KubernetesPodOperator whose pod survives spot reclaims.

It keeps every KubernetesPodOperator parameter (image, cmds, arguments, env_vars,
container_resources, volumes, pod_template_file, namespace, kubernetes_conn_id,
deferrable, ...) and builds the user's pod with KPO's own ``build_pod_request_obj``. That
pod is not created as it is: it becomes the ``pod_template`` of the ``kubernetes``
provider, which merges it under each attempt's pod (placement on a spot node pool by
node affinity and tolerations, the step under ``spot-pipelines watch``, the SPOT_*
checkpoint environment, the spot-pipelines labels). The job is then driven through the
controller exactly like ``SpotJobOperator`` (``ControllerDriverMixin``): a pod disrupted
by a reclaim (its ``DisruptionTarget`` condition, a graceful node shutdown, its node
gone after a notice) is relaunched on another pool from the newest checkpoint inside the
same Airflow try; only the step's own failure (a non-zero exit, an OOM kill) raises and
spends Airflow ``retries``. The JobRecord lives in the task state store and XCom; the
cluster is reached through ``kubernetes_conn_id`` in the worker and in the triggerer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowFailException
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from airflow_spot.hooks.kubernetes import CONNECTION_OPTIONS, PROVIDER, SpotKubernetesHook
from airflow_spot.links.kubernetes import SpotKubernetesPodLink
from airflow_spot.links.spot import SpotCheckpointLink
from airflow_spot.operators.controller_driver import ControllerDriverMixin
from airflow_spot.triggers.kubernetes import SpotKubernetesPodTrigger
from spot_core import jobs
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.controller import JobSpec, Next
from spot_core.errors import ConfigError
from spot_core.model import Lease
from spot_core.settings import POD_OPERATOR, SpotSettings, default, knobs_for, pop_aliases

Duration = timedelta | float | str  # seconds, a timedelta, or "90s" / "5m" / "2h" / "1d"
CHECKPOINT_SCHEMES = ("file://", "s3://")
# What the provider decides for every attempt's pod, so a user value would be overridden
# or would defeat the lifecycle (a kept pod outlives its attempt).
DELETE_POD = "delete_pod"
LOG_DRAIN_SECONDS = 10.0  # after an attempt ends, how long its log stream may still flush


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


# KubernetesPodOperator's own timeouts, and the provider options that mean the same.
KPO_TIMEOUTS = {
    "startup_timeout_seconds": "start_timeout",
    "schedule_timeout_seconds": "unschedulable_timeout",
}


def _refuse_kpo_lifecycle(kwargs: Mapping[str, Any]) -> None:
    """KPO parameters about its own pod lifecycle that a spot job cannot honour: refused
    when the DAG is parsed, never silently ignored."""
    task = kwargs.get("task_id", "")
    if kwargs.get("callbacks"):
        raise ValueError(
            f"{task}: callbacks={kwargs['callbacks']!r} cannot run: each spot "
            "attempt's pod is created, watched and deleted by the spot "
            "controller, not by KubernetesPodOperator's pod manager, so its "
            "callbacks would never fire; drop callbacks (every attempt is in the "
            "JobRecord, XCom key 'spot_job_record')"
        )
    for name in ("reattach_on_restart", "durable"):
        if kwargs.get(name) is False:
            raise ValueError(
                f"{task}: {name}=False: a spot job always picks up its running "
                "attempt's pod when a worker restarts (the JobRecord in the task "
                "state store names it), and a new pod per try would leave the old "
                f"one running; drop {name}"
            )


def _kpo_timeouts(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """KPO's startup/schedule timeouts the user passed, as the provider options they are:
    ``startup_timeout_seconds`` (scheduled to started) is ``start_timeout``,
    ``schedule_timeout_seconds`` (time to a node) is ``unschedulable_timeout``."""
    return {
        option: kwargs[name]
        for name, option in KPO_TIMEOUTS.items()
        if kwargs.get(name) is not None
    }


def _with_timeouts(options: Any, timeouts: Mapping[str, Any], task: str) -> Any:
    if not timeouts or not isinstance(options, Mapping):
        return options
    both = sorted(set(timeouts) & set(options))
    if both:
        given = {name for name, option in KPO_TIMEOUTS.items() if option in both}
        raise ValueError(
            f"{task}: {sorted(given)} and provider_options {both} set the same timeout; keep one"
        )
    for option, value in timeouts.items():
        try:
            jobs.check_provider(PROVIDER, {option: value})
        except ConfigError as exc:
            name = next(n for n, o in KPO_TIMEOUTS.items() if o == option)
            raise ValueError(f"{task}: {name}={value!r}: {exc}") from None
    return {**options, **timeouts}


class SpotKubernetesPodOperator(ControllerDriverMixin, KubernetesPodOperator):
    """Run a KubernetesPodOperator pod on spot node pools until it succeeds.

    Every KubernetesPodOperator parameter keeps its meaning; ``cmds`` (with
    ``arguments``) is required, since the step runs under ``spot-pipelines watch``, which
    forwards the node's interruption notice to it.

    :param checkpoint_uri: ``file:///abs/path`` (a volume every node mounts) or
        ``s3://bucket/prefix`` where the step checkpoints; each attempt resumes from its
        newest checkpoint (templated).
    :param provider_options: the ``kubernetes`` provider's options other than the cluster
        connection and the pod template, e.g. ``{"prices": {...},
        "unschedulable_timeout": 60}`` (templated). The cluster comes from
        ``kubernetes_conn_id`` / ``config_file`` / ``in_cluster`` / ``cluster_context``.
    :param zones: restrict the job to node pools in these zones (default: every zone).
    :param node_pools: restrict the job to the pools (zone, instance type, market) whose
        nodes belong to these node pools (default: every pool). A pod is placed by zone,
        instance type and capacity label, so two node pools sharing all three share a pool.
    :param poll_interval: time between observations of the attempt's pod (KPO's
        parameter, with the spot default).

    KubernetesPodOperator's own ``startup_timeout_seconds`` and
    ``schedule_timeout_seconds`` are honoured as the provider's ``start_timeout`` and
    ``unschedulable_timeout``; ``reattach_on_restart`` / ``durable`` are what a spot job
    always does (False is refused); ``callbacks`` are refused, since KPO's pod manager,
    which would call them, does not run the attempts' pods.

    The spot settings (``max_preemptions``, ``on_demand_fallback``, ``return_to_spot``,
    ``min_on_demand``, ``max_spot_price``, ``capacity_wait``, ``max_capacity_waits``,
    ``max_infrastructure_retries``, ``max_disruptions``, ``deadline``, ``work``, ``total_steps``,
    ``restart_overhead``, ``deadline_policy``, ``attempt_timeout``, ``heartbeat_timeout``,
    ``heartbeat_uri``, ``take_over``, ``observe_failure_timeout``) mean what they mean for
    ``SpotJobOperator``: the meaning, default and check of each knob is in
    ``spot_core.settings``.
    """

    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields,
        "checkpoint_uri",
        "provider_options",
    )
    template_fields_renderers = {
        **KubernetesPodOperator.template_fields_renderers,
        "provider_options": "json",
    }
    operator_extra_links = (SpotCheckpointLink(), SpotKubernetesPodLink())
    ui_color = "#f9d27a"

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        provider_options: Mapping[str, Any] | None = None,
        zones: Sequence[str] = default("zones"),
        node_pools: Sequence[str] = (),
        max_preemptions: int = default("max_preemptions"),
        on_demand_fallback: bool = default("on_demand_fallback"),
        return_to_spot: bool = default("return_to_spot"),
        min_on_demand: Duration = default("min_on_demand"),
        max_spot_price: float | None = default("max_spot_price"),
        capacity_wait: Duration = default("capacity_wait"),
        max_capacity_waits: int = default("max_capacity_waits"),
        max_infrastructure_retries: int = default("max_infrastructure_retries"),
        max_disruptions: int = default("max_disruptions"),
        deadline: Duration | datetime | None = default("deadline"),
        work: Duration | None = default("work"),
        total_steps: int | None = default("total_steps"),
        restart_overhead: Duration = default("restart_overhead"),
        deadline_policy: str | None = default("deadline_policy"),
        attempt_timeout: Duration = default("attempt_timeout"),
        poll_interval: Duration = default("poll_interval"),
        heartbeat_timeout: Duration = default("heartbeat_timeout"),
        heartbeat_uri: str | None = default("heartbeat_uri"),
        take_over: bool = default("take_over"),
        handover: str | None = default("handover"),
        observe_failure_timeout: Duration = default("observe_failure_timeout"),
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        given = locals()  # first: the knobs as written (the settings model checks them)
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        if not isinstance(deferrable, bool):
            raise ValueError(
                f"{kwargs.get('task_id', '')}: deferrable={deferrable!r} must be True or False"
            )
        _refuse_kpo_lifecycle(kwargs)
        timeouts = _kpo_timeouts(kwargs)
        super().__init__(deferrable=deferrable, **kwargs)
        self.checkpoint_uri = checkpoint_uri
        self.provider_options = _with_timeouts(
            {} if provider_options is None else provider_options, timeouts, self.task_id
        )
        self.node_pools = self._names("node_pools", node_pools)
        self._validate_static()
        self._adopt_settings(
            self._settings(
                {
                    **{k.name: given[k.name] for k in knobs_for(POD_OPERATOR)},
                    "provider_options": self.provider_options,
                    "zones": () if zones is None else zones,
                    **renamed,
                }
            )
        )
        self._spot_hook: SpotKubernetesHook | None = None

    # -- parse-time validation --------------------------------------------------------------
    def _names(self, name: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(
                f"{self.task_id}: {name}={value!r} must be a list of names, "
                "e.g. ['spot-a', 'spot-b']"
            )
        return tuple(value)

    def _settings(self, values: dict[str, Any]) -> SpotSettings:
        """The spot settings, checked by the model; one line naming the task and the fix."""
        try:
            return SpotSettings.build(where=self.task_id, provider=PROVIDER, **values)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def _validate_static(self) -> None:
        """What a spot pod needs, as written (templates are checked once rendered)."""
        task = self.task_id
        if not self.cmds:
            raise ValueError(
                f"{task}: cmds is required: the step runs under spot-pipelines "
                "watch, which needs its command, e.g. cmds=['python', '-m', "
                "'my.train'] (the image's entrypoint cannot be wrapped)"
            )
        if self.do_xcom_push:
            raise ValueError(
                f"{task}: do_xcom_push=True (KPO's xcom sidecar) is not supported "
                "on spot pods: keep results in the checkpoint store; the JobRecord "
                "goes to XCom under key 'spot_job_record' anyway"
            )
        for name in ("on_finish_action", "on_kill_action"):
            if getattr(self, name).value != DELETE_POD:
                raise ValueError(
                    f"{task}: {name}={getattr(self, name).value!r}: every spot "
                    "attempt's pod is deleted when it ends (a kept pod would hold "
                    f"its node); drop {name}"
                )
        if not isinstance(self.provider_options, Mapping):
            raise ValueError(
                f"{task}: provider_options={self.provider_options!r} must be a "
                "mapping, e.g. {'unschedulable_timeout': 60}"
            )
        given = sorted(set(self.provider_options) & {*CONNECTION_OPTIONS, "pod_template"})
        if given:
            raise ValueError(
                f"{task}: provider_options {given} come from the operator: the "
                "cluster from kubernetes_conn_id / config_file / in_cluster / "
                "cluster_context, the pod from its KubernetesPodOperator "
                "parameters; drop them from provider_options"
            )
        self._check_uri(self.checkpoint_uri, ValueError)
        self._check_store_reachable()

    def _check_store_reachable(self) -> None:
        """A file:// store with no volume mounted at all cannot be the pods' (the rendered
        pod is checked again in ``execute``, volumes from a template file included)."""
        uri = self.checkpoint_uri
        if (
            _is_template(uri)
            or not str(uri).startswith("file://")
            or self.volume_mounts
            or self.pod_template_file
            or self.pod_template_dict
            or self.full_pod_spec
        ):
            return
        raise ValueError(
            f"{self.task_id}: checkpoint_uri={uri!r} is on this machine's disk, "
            "which the pods cannot see: use s3://bucket/prefix, or a file:// path "
            "under one of volume_mounts (a PVC every pod mounts)"
        )

    def _check_uri(self, uri: Any, error: type[Exception]) -> None:
        if _is_template(uri):
            return
        try:
            parse_store_uri(uri)
        except ConfigError as exc:
            raise error(f"{self.task_id}: checkpoint_uri: {exc}") from None
        if not str(uri).startswith(CHECKPOINT_SCHEMES):
            raise error(
                f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// or "
                "s3://, e.g. s3://bucket/train"
            )

    def _validate_rendered(self) -> None:
        """Templated fields as rendered: the parse-time checks, failing without retries."""
        self._check_uri(self.checkpoint_uri, AirflowFailException)
        try:
            if not isinstance(self.provider_options, Mapping):
                raise ConfigError(
                    f"provider_options rendered as {self.provider_options!r}, not a mapping"
                )
            jobs.check_provider(PROVIDER, self.provider_options)
        except ConfigError as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    # -- the pod and the provider -----------------------------------------------------------
    @property
    def spot_hook(self) -> SpotKubernetesHook:
        if self._spot_hook is None:
            raise RuntimeError("spot_hook is opened by execute / execute_complete")
        return self._spot_hook

    def _open_spot_hook(self, context) -> SpotKubernetesHook:
        """The user's pod (KPO's own build, rendered for this run) as the provider's pod
        template, and the cluster from the Kubernetes connection."""
        self.name = self._set_name(self.name)
        pod = self.build_pod_request_obj(context)
        self.pod_request_obj = pod
        template = ApiClient().sanitize_for_serialization(pod)  # the API's JSON shape
        if not jobs.provider_plugin(PROVIDER).reaches_store(
            self.checkpoint_uri, {"pod_template": template}
        ):
            raise AirflowFailException(
                f"{self.task_id}: checkpoint_uri={self.checkpoint_uri!r} is on this machine's "
                "disk, which the pods cannot see: use s3://bucket/prefix, or a file:// path "
                "under one of the pod's volume_mounts (a PVC every pod mounts)"
            )
        options = {
            **self.provider_options,
            "namespace": pod.metadata.namespace,
            "pod_template": template,
        }
        self._spot_hook = SpotKubernetesHook(
            options,
            kubernetes_conn_id=self.kubernetes_conn_id,
            cluster_context=self.cluster_context,
            config_file=self.config_file,
            in_cluster=self.in_cluster,
        )
        return self._spot_hook

    def _spec(self, job_id: str, created_at: float | None) -> JobSpec:
        provider = self.spot_hook.get_provider()
        try:
            pools = jobs.select_pools(
                provider,
                zones=self.settings.zones,
                keep=lambda pool: (
                    not self.node_pools or bool(set(self._node_pools(pool)) & set(self.node_pools))
                ),
            )
        except ConfigError as exc:  # name the cluster's node pools: what node_pools= picks
            offered = provider.pools()
            names = sorted({n for p in offered for n in self._node_pools(p)})
            raise AirflowFailException(
                f"{self.task_id}: {exc} (zones={self.zones}, node_pools="
                f"{list(self.node_pools) or None}; the cluster has node pools "
                f"{', '.join(names) or 'none'} in zones "
                f"{', '.join(sorted({p.zone for p in offered})) or 'none'})"
            ) from None
        try:
            return jobs.job_spec(
                self.settings,
                provider,
                job_id=job_id,
                command=(*self.cmds, *self.arguments),
                checkpoint_uri=self.checkpoint_uri,
                pools=pools,
                image=self.image or None,
                created_at=created_at,
            )
        except ConfigError as exc:  # a deadline the work cannot fit
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    def _node_pools(self, pool) -> tuple[str, ...]:
        """The cluster's node pools behind one pool (zone, instance type, market)."""
        nodes = self.spot_hook.get_provider().market.pool_nodes(pool)
        return () if nodes is None else tuple(nodes.node_pools)

    # -- execution ----------------------------------------------------------------------------
    def execute(self, context) -> dict[str, Any]:
        self._open_spot_hook(context)
        return self._start(context)

    def execute_complete(self, context, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self._open_spot_hook(context)  # a relaunch after the trigger needs the pod template
        return super().execute_complete(context, event)

    def _trigger(self, spec: JobSpec, nxt: Next, not_before: float) -> SpotKubernetesPodTrigger:
        return SpotKubernetesPodTrigger(
            **self._watch_kwargs(spec, nxt, not_before),
            kubernetes_conn_id=self.kubernetes_conn_id,
            cluster_context=self.cluster_context,
            config_file=self.config_file,
            in_cluster=self.in_cluster,
        )

    def _watch_here(self, controller, spec: JobSpec, nxt: Next) -> Next:
        """Watch the attempt here, its step's log in the task log meanwhile (``get_logs``)."""
        follower = self._follow_logs(nxt.lease) if self.get_logs else None
        try:
            return super()._watch_here(controller, spec, nxt)
        finally:
            if follower is not None:
                follower.join(timeout=LOG_DRAIN_SECONDS)

    def _follow_logs(self, lease: Lease | None) -> threading.Thread | None:
        """Stream the attempt's step container into the task log with KPO's own
        ``PodManager.fetch_container_logs`` (its prefix and ``log_formatter``), in a thread
        that ends with the container or its pod."""
        where = None if lease is None else SpotKubernetesPodLink.pod_of(lease)
        if where is None:
            return None
        namespace, name = where
        pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))

        def follow() -> None:
            try:
                container = jobs.provider_plugin(PROVIDER).step_container
                if container is None:  # never: the kubernetes plugin names its step's
                    raise ConfigError(f"provider {PROVIDER!r} names no step container")
                self.pod_manager.fetch_container_logs(
                    pod,
                    container,
                    follow=True,
                    container_name_log_prefix_enabled=self.container_name_log_prefix_enabled,
                    log_formatter=self.log_formatter,
                )
            except Exception as exc:  # noqa: BLE001 - the pod went with its attempt
                self.log.debug("stopped following the log of pod %s: %s", name, exc)

        thread = threading.Thread(target=follow, name=f"log-{name}", daemon=True)
        thread.start()
        return thread

    @property
    def _push_record(self) -> bool:
        return True  # under its own key; KPO's do_xcom_push means its sidecar

    def _persist_lease_link(self, context, lease: Lease | None) -> None:
        """The attempt's pod as the cluster's API serves it; a link never fails the task
        (a launched pod would be left to its heartbeat)."""
        pod = None if lease is None else SpotKubernetesPodLink.pod_of(lease)
        try:
            url = (
                ""
                if pod is None
                # KPO types its hook as PodOperatorHookProtocol; it is a KubernetesHook
                else SpotKubernetesPodLink.url_for(
                    self.hook.api_client.configuration.host,  # type: ignore[attr-defined]
                    *pod,
                )
            )
            SpotKubernetesPodLink.persist(context, url)
        except Exception as exc:  # noqa: BLE001 - logged; the attempt goes on
            self.log.warning("could not store the pod link: %s", exc)

    def on_kill(self) -> None:
        """Stop the attempt this worker watches through the controller (its pod deleted)."""
        ControllerDriverMixin.on_kill(self)
