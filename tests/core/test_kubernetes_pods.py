"""The pure half of the kubernetes provider, on pod and node JSON shaped as the API sends it:
pools from each flavour's node labels, the attempt's pod (and the user's template merged
under it), and why a pod ended, through the controller's one classifier."""

from __future__ import annotations

import copy

import pytest

from spot_core.controller import classify
from spot_core.errors import ConfigError
from spot_core.interruption.kubernetes import KubernetesNodeDetector, node_notice
from spot_core.market.kubernetes import (
    KubernetesMarket,
    PriceTable,
    check_prices,
    node_info,
)
from spot_core.model import Market, Outcome, Pool
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import LaunchSpec

NOW = 1_790_000_000.0


def node(name, labels, taints=(), unschedulable=False, ready=True):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/region": "us-east-1",
                "topology.kubernetes.io/zone": "us-east-1a",
                "node.kubernetes.io/instance-type": "m5.xlarge",
                **labels,
            },
        },
        "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}
            ]
        },
    }


FLAVOUR_NODES = {
    "karpenter": node(
        "k-1", {"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "gpu"}
    ),
    "eks": node(
        "e-1", {"eks.amazonaws.com/capacityType": "SPOT", "eks.amazonaws.com/nodegroup": "spot-ng"}
    ),
    "gke-spot": node(
        "g-1",
        {
            "cloud.google.com/gke-spot": "true",
            "cloud.google.com/gke-nodepool": "spot-pool",
            "topology.kubernetes.io/zone": "us-central1-a",
            "node.kubernetes.io/instance-type": "e2-standard-4",
        },
    ),
    "gke-preemptible": node(
        "p-1",
        {"cloud.google.com/gke-preemptible": "true", "cloud.google.com/gke-nodepool": "old-pool"},
    ),
    "aks": node(
        "a-1",
        {
            "kubernetes.azure.com/scalesetpriority": "spot",
            "kubernetes.azure.com/agentpool": "spotpool",
        },
        taints=[
            {
                "key": "kubernetes.azure.com/scalesetpriority",
                "value": "spot",
                "effect": "NoSchedule",
            }
        ],
    ),
}


@pytest.mark.parametrize("flavour", sorted(FLAVOUR_NODES))
def test_each_flavours_spot_node_is_a_schedulable_spot_pool(flavour):
    info = node_info(FLAVOUR_NODES[flavour])
    assert info.pool.market is Market.SPOT and info.flavour == flavour
    assert info.schedulable  # AKS's spot taint is one the pod tolerates
    assert info.node_pool


def test_on_demand_nodes_and_unavailable_nodes():
    eks_od = node_info(
        node(
            "e-2",
            {"eks.amazonaws.com/capacityType": "ON_DEMAND", "eks.amazonaws.com/nodegroup": "od"},
        )
    )
    plain = node_info(node("n-1", {}))
    assert eks_od.pool.market is Market.ON_DEMAND and eks_od.node_pool == "od"
    assert plain.pool.market is Market.ON_DEMAND and plain.flavour == "generic"
    karp = {"karpenter.sh/capacity-type": "spot"}
    assert not node_info(
        node("k-2", karp, taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    ).schedulable
    assert not node_info(node("k-3", karp, unschedulable=True)).schedulable
    assert not node_info(node("k-4", karp, ready=False)).schedulable


def test_market_offers_prices_from_configuration_and_capacity_from_nodes():
    nodes = [
        FLAVOUR_NODES["eks"],
        node(
            "e-2",
            {"eks.amazonaws.com/capacityType": "ON_DEMAND", "eks.amazonaws.com/nodegroup": "od"},
        ),
    ]
    market = KubernetesMarket(
        lambda: nodes,
        PriceTable(check_prices({"spot-ng": {"spot": 0.07}, "m5.xlarge": {"on_demand": 0.2}})),
        clock=lambda: NOW,
    )
    spot, od = market.pools(Market.SPOT)[0], market.pools(Market.ON_DEMAND)[0]
    offer_spot, offer_od = market.offers([spot, od], NOW)
    assert (offer_spot.price_per_hour, offer_spot.on_demand_price_per_hour) == (0.07, 0.2)
    assert offer_od.price_per_hour == 0.2 and offer_od.available and offer_spot.available
    missing = Pool("kubernetes", "us-east-1", "us-east-1b", "m5.xlarge", Market.ON_DEMAND)
    assert not market.offers([missing], NOW)[0].available
    market.note_capacity_miss(spot, NOW)
    assert not market.offers([spot], NOW + 1)[0].available


def test_unknown_price_is_one_line_naming_the_option():
    pool = node_info(
        node(
            "x",
            {
                "karpenter.sh/capacity-type": "spot",
                "karpenter.sh/nodepool": "np",
                "node.kubernetes.io/instance-type": "weird.large",
            },
        )
    ).pool
    with pytest.raises(ConfigError, match="prices="):
        PriceTable({}).price(pool, ["np"])
    with pytest.raises(ConfigError, match=r"prices\['x'\]"):
        check_prices({"x": {"spot": -1}})


# -- the pod -------------------------------------------------------------------------------
SPEC = LaunchSpec(
    job_id="train:42",
    attempt=3,
    command=("python", "train.py"),
    checkpoint_uri="s3://bucket/ckpt",
    env={"EPOCHS": "2"},
    heartbeat_timeout_seconds=300,
)


def _terms(pod):
    return pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]


def test_pod_runs_the_step_under_watch_with_labels_env_and_placement():
    pool = node_info(FLAVOUR_NODES["aks"]).pool
    pod = pods.build_pod(
        SPEC,
        pool,
        name="spot-train-42-3-abcde",
        namespace="ml",
        image="reg/step:1",
        flavours=["aks"],
    )
    meta, container = pod["metadata"], pod["spec"]["containers"][0]
    assert meta["labels"][pods.LABEL_MANAGED] == "true"
    assert meta["labels"][pods.LABEL_ATTEMPT] == "3"
    assert meta["annotations"][pods.ANNOTATION_JOB_ID] == "train:42"
    assert container["command"][:4] == ["spot-pipelines", "watch", "--cloud", "kubernetes"]
    assert container["command"][-3:] == ["--", "python", "train.py"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SPOT_ATTEMPT"]["value"] == "3" and env["EPOCHS"]["value"] == "2"
    assert env["SPOT_HEARTBEAT_TIMEOUT"]["value"] == "300"
    assert env["SPOT_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["spec"]["restartPolicy"] == "Never"
    (term,) = _terms(pod)
    keys = {e["key"]: e for e in term["matchExpressions"]}
    assert keys["kubernetes.azure.com/scalesetpriority"]["values"] == ["spot"]
    assert keys["topology.kubernetes.io/zone"]["values"] == ["us-east-1a"]
    assert {
        "key": "kubernetes.azure.com/scalesetpriority",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["spec"]["tolerations"]


def test_on_demand_placement_excludes_every_spot_label():
    pool = node_info(node("n", {})).pool
    pod = pods.build_pod(SPEC, pool, name="p", namespace="ml", image="i")
    (term,) = _terms(pod)
    excluded = {e["key"] for e in term["matchExpressions"] if e["operator"] == "NotIn"}
    assert "karpenter.sh/capacity-type" in excluded and "cloud.google.com/gke-spot" in excluded
    assert not pod["spec"]["tolerations"]


def test_users_template_is_merged_under_ours():
    template = {
        "metadata": {"labels": {"team": "ml", pods.LABEL_MANAGED: "no"}},
        "spec": {
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                        ]
                    }
                }
            },
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {
                    "name": "step",
                    "image": "theirs:1",
                    "resources": {"limits": {"memory": "1Gi"}},
                    "env": [
                        {"name": "SPOT_ATTEMPT", "value": "99"},
                        {"name": "MINE", "value": "1"},
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": "/d"}],
                },
                {"name": "sidecar", "image": "side:1"},
            ],
        },
    }
    before = copy.deepcopy(template)
    pool = node_info(FLAVOUR_NODES["karpenter"]).pool
    pod = pods.build_pod(
        SPEC,
        pool,
        name="p",
        namespace="ml",
        image="default:1",
        pod_template=template,
        flavours=["karpenter"],
    )
    assert template == before  # never modified
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"][pods.LABEL_MANAGED] == "true"
    step = pod["spec"]["containers"][0]
    assert step["image"] == "theirs:1" and step["resources"]["limits"]["memory"] == "1Gi"
    assert step["volumeMounts"] and pod["spec"]["containers"][1]["name"] == "sidecar"
    env = {e["name"]: e.get("value") for e in step["env"]}
    assert env["SPOT_ATTEMPT"] == "3" and env["MINE"] == "1"
    (term,) = _terms(pod)  # ours AND theirs
    keys = [e["key"] for e in term["matchExpressions"]]
    assert "karpenter.sh/capacity-type" in keys and "gpu" in keys
    assert {"key": "gpu", "operator": "Exists"} in pod["spec"]["tolerations"]
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}


def test_pod_deserialises_in_the_official_clients_models():
    import kubernetes

    pool = node_info(FLAVOUR_NODES["gke-spot"]).pool
    body = pods.build_pod(SPEC, pool, name="p", namespace="ml", image="i", flavours=["gke-spot"])
    api = kubernetes.client.ApiClient()
    model = api._ApiClient__deserialize(body, "V1Pod")
    assert model.spec.containers[0].env[-3].value_from.field_ref.field_path == "spec.nodeName"
    assert api.sanitize_for_serialization(model) == body


def test_names_and_label_values_are_valid():
    assert pods.label_value("train:42") != "train:42"
    assert len(pods.label_value("x" * 200)) <= 63
    assert pods.label_value("plain-job") == "plain-job"
    name = pods.pod_name("My_Job:" + "y" * 90, 12, "abcde")
    assert len(name) <= 63 and name.endswith("-12-abcde") and name == name.lower()


# -- why a pod ended ----------------------------------------------------------------------
def pod(
    phase="Running",
    *,
    exit_code=None,
    reason=None,
    conditions=(),
    status_reason=None,
    message=None,
    deleting=False,
    node_name="k-1",
):
    state = {"running": {"startedAt": "2026-09-21T10:00:05Z"}}
    if exit_code is not None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": "2026-09-21T10:00:05Z",
                "finishedAt": "2026-09-21T10:05:00Z",
                **({"message": message} if message else {}),
            }
        }
    meta = {
        "name": "spot-job-1-abcde",
        "namespace": "default",
        "labels": {pods.LABEL_MANAGED: "true"},
    }
    if deleting:
        meta.update(deletionTimestamp="2026-09-21T10:04:58Z", deletionGracePeriodSeconds=30)
    status = {
        "phase": phase,
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-09-21T10:00:00Z",
            },
            *conditions,
        ],
        "containerStatuses": [
            {
                "name": "step",
                "state": state,
                "ready": False,
                "restartCount": 0,
                "image": "i",
                "imageID": "",
            }
        ],
    }
    if status_reason:
        status.update(reason=status_reason, message=message or "")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node_name, "containers": [{"name": "step", "image": "i"}]},
        "status": status,
    }


def disrupted(reason, message="disrupted"):
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-09-21T10:04:58Z",
    }


def outcome(*args, **kwargs):
    return classify(pods.pod_status(*args, now=NOW, **kwargs))


ON_DEMAND_NODE = node("o-1", {"eks.amazonaws.com/capacityType": "ON_DEMAND"})
REASONS = [
    "PreemptionByScheduler",
    "PreemptionByKubeScheduler",
    "DeletionByTaintManager",
    "DeletionByPodGC",
    "EvictionByEvictionAPI",
    "TerminationByKubelet",
    "DeletionByDeviceTaintManager",
    "ReasonFromAFutureRelease",
]


@pytest.mark.parametrize("reason", REASONS)
def test_any_disruption_reason_is_a_disruption_whatever_the_exit_code(reason):
    for code in (143, 137, 1, 0):
        for phase in ("Failed", "Succeeded"):
            ended = pod(phase, exit_code=code, conditions=[disrupted(reason)])
            assert outcome(ended, FLAVOUR_NODES["karpenter"]) is Outcome.PREEMPTED
            assert outcome(ended, ON_DEMAND_NODE) not in (Outcome.SUCCEEDED, Outcome.USER_FAILED)
    status = pods.pod_status(pod("Failed", exit_code=143, conditions=[disrupted(reason)]), now=NOW)
    assert status.notice_at is not None and reason in status.message


def test_exit_zero_after_a_disruption_is_a_success_only_when_the_step_reported_completion():
    cut_short = pod(
        "Succeeded",
        exit_code=0,
        conditions=[
            disrupted(
                "TerminationByKubelet", "Pod was terminated in response to imminent node shutdown."
            )
        ],
        status_reason="Terminated",
        message="Pod was terminated in response to imminent node shutdown.",
    )
    assert outcome(cut_short, FLAVOUR_NODES["gke-spot"]) is Outcome.PREEMPTED
    asked = []
    done = pods.pod_status(
        cut_short, FLAVOUR_NODES["gke-spot"], now=NOW, completed=lambda: asked.append(1) or True
    )
    assert classify(done) is Outcome.SUCCEEDED and asked == [1]
    pods.pod_status(
        pod("Succeeded", exit_code=0),
        FLAVOUR_NODES["gke-spot"],
        now=NOW,
        completed=lambda: asked.append(2) or True,
    )
    assert asked == [1]  # an undisrupted exit 0 needs no store read


def test_a_disruption_condition_on_a_running_pod_is_a_notice_that_may_be_withdrawn():
    at = pods.parse_time("2026-09-21T10:04:58Z")
    running = pod(conditions=[disrupted("PreemptionByScheduler")])
    status = pods.pod_status(running, FLAVOUR_NODES["karpenter"], now=at + 5)
    assert status.state.value == "running" and status.notice_at == at
    # Kubernetes clears a condition its deletion did not follow within about two minutes:
    # until then (plus a margin) it is not acted on, and once cleared it is forgotten
    assert not pods.pod_status(running, FLAVOUR_NODES["karpenter"], now=at + 140).ended
    cleared = pod()
    assert pods.pod_status(cleared, FLAVOUR_NODES["karpenter"], now=at + 140).notice_at is None
    going = pod(conditions=[disrupted("EvictionByEvictionAPI")], deleting=True)
    assert pods.pod_status(going, FLAVOUR_NODES["karpenter"], now=at).notice_at is not None


@pytest.mark.parametrize(
    "reason,message",
    [
        ("Shutdown", "Node is shutting, evicting pods"),  # 1.20, 1.21
        ("Terminated", "Pod was terminated in response to imminent node shutdown."),  # 1.22+
        ("NodeShutdown", "Pod was rejected as the node is shutting down."),  # admission 1.21+
        ("Shutdown", "Pod Node is in progress of shutting down, not admitting any new pods"),
    ],
)
def test_graceful_node_shutdown_of_every_version_is_a_preemption_in_any_phase(reason, message):
    for phase in ("Failed", "Running", "Succeeded"):
        gns = pod(
            phase,
            exit_code=0 if phase == "Succeeded" else 143,
            status_reason=reason,
            message=message,
        )
        assert outcome(gns, None) is Outcome.PREEMPTED, phase


def test_node_pressure_is_the_infrastructures_and_an_own_storage_limit_the_steps():
    pressure = pod(
        "Failed",
        exit_code=137,
        status_reason="Evicted",
        message="The node was low on resource: memory. Container step was using "
        "9402820Ki, which exceeds its request of 7G. ",
    )
    assert outcome(pressure, FLAVOUR_NODES["karpenter"]) is Outcome.INFRASTRUCTURE_FAILED
    kubelet = pod(
        "Succeeded",
        exit_code=0,
        conditions=[
            disrupted(
                "TerminationByKubelet",
                "The node was low on resource: ephemeral-storage. Threshold "
                "quantity: 1Gi, available: 898240Ki. ",
            )
        ],
    )
    assert outcome(kubelet, FLAVOUR_NODES["karpenter"]) is Outcome.INFRASTRUCTURE_FAILED
    own = pod(
        "Succeeded",
        exit_code=0,
        status_reason="Evicted",
        message="Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
    )
    assert outcome(own, FLAVOUR_NODES["karpenter"]) is Outcome.USER_FAILED


def test_voluntary_disruptions_by_their_evidence():
    evicted = pod("Failed", exit_code=143, conditions=[disrupted("EvictionByEvictionAPI")])
    # a drain of an on-demand node is voluntary; of a spot node a spot handler's, unless
    # the events say who did it
    assert outcome(evicted, ON_DEMAND_NODE) is Outcome.DISRUPTED
    assert outcome(evicted, FLAVOUR_NODES["karpenter"]) is Outcome.PREEMPTED
    consolidated = [
        {
            "reason": "Evicted",
            "message": "Evicted pod: Underutilized",
            "source": {"component": "karpenter"},
        }
    ]
    assert outcome(evicted, FLAVOUR_NODES["karpenter"], events=consolidated) is Outcome.DISRUPTED
    interrupted = [
        {
            "reason": "SpotInterrupted",
            "message": "Spot interruption warning was triggered",
            "source": {"component": "karpenter"},
        },
        *consolidated,
    ]
    assert outcome(evicted, FLAVOUR_NODES["karpenter"], events=interrupted) is Outcome.PREEMPTED
    scale_down = node(
        "k-1",
        {"karpenter.sh/capacity-type": "spot"},
        taints=[
            {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
        ],
    )
    assert outcome(pod("Failed", exit_code=143), scale_down) is Outcome.DISRUPTED


def test_step_stopped_on_its_nodes_notice_taint():
    tainted = node(
        "k-1",
        {"karpenter.sh/capacity-type": "spot"},
        taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}],
    )
    assert outcome(pod("Failed", exit_code=143), tainted) is Outcome.PREEMPTED
    assert (
        outcome(
            pod("Failed", exit_code=143),
            node("k-1", {"eks.amazonaws.com/capacityType": "SPOT"}, unschedulable=True),
        )
        is Outcome.PREEMPTED
    )
    assert (
        outcome(pod("Failed", exit_code=143), node("k-1", {}, unschedulable=True))
        is Outcome.DISRUPTED
    )


def test_oom_and_non_zero_exit_are_the_users_failure_exit_zero_succeeds():
    oom = pods.pod_status(
        pod("Failed", exit_code=137, reason="OOMKilled"), FLAVOUR_NODES["karpenter"], now=NOW
    )
    assert classify(oom) is Outcome.USER_FAILED and "OOMKilled" in oom.message
    oom_zero = pod("Failed", exit_code=0, reason="OOMKilled")  # cgroup v2 can report 0
    assert outcome(oom_zero, FLAVOUR_NODES["karpenter"]) is Outcome.USER_FAILED
    assert outcome(pod("Failed", exit_code=143), FLAVOUR_NODES["karpenter"]) is Outcome.USER_FAILED
    failed = pods.pod_status(
        pod("Failed", exit_code=2, message="Traceback\nValueError: bad lr"),
        FLAVOUR_NODES["karpenter"],
        now=NOW,
    )
    assert classify(failed) is Outcome.USER_FAILED and "ValueError: bad lr" in failed.message
    assert outcome(pod("Succeeded", exit_code=0), FLAVOUR_NODES["karpenter"]) is Outcome.SUCCEEDED
    assert not pods.pod_status(pod(), FLAVOUR_NODES["karpenter"], now=NOW).ended
    # a terminal pod whose node went away afterwards is judged by its own end
    assert outcome(pod("Failed", exit_code=1), None) is Outcome.USER_FAILED


def test_last_state_carries_the_verdict_of_a_restarted_container():
    restarted = pod("Failed")
    restarted["status"]["containerStatuses"][0].update(
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={
            "terminated": {
                "exitCode": 137,
                "reason": "OOMKilled",
                "finishedAt": "2026-09-21T10:05:00Z",
            }
        },
    )
    assert outcome(restarted, FLAVOUR_NODES["karpenter"]) is Outcome.USER_FAILED


def test_a_v1pod_and_its_snake_case_dump_classify_as_the_api_json():
    import kubernetes

    api = kubernetes.client.ApiClient()
    ended = pod("Failed", exit_code=143, conditions=[disrupted("DeletionByPodGC")])
    model = api._ApiClient__deserialize(copy.deepcopy(ended), "V1Pod")
    for shape in (ended, model, model.to_dict()):
        status = pods.pod_status(shape, FLAVOUR_NODES["karpenter"], now=NOW)
        assert classify(status) is Outcome.PREEMPTED and status.exit_code == 143
    oom = api._ApiClient__deserialize(pod("Failed", exit_code=137, reason="OOMKilled"), "V1Pod")
    assert classify(pods.pod_status(oom.to_dict(), now=NOW)) is Outcome.USER_FAILED


def test_a_pod_under_notice_ends_within_its_grace_period_and_a_margin():
    at = pods.parse_time("2026-09-21T10:04:58Z")
    lost_node = node("k-1", {"karpenter.sh/capacity-type": "spot"}, ready=False)
    lost_node["status"]["conditions"][0].update(
        reason="NodeStatusUnknown", status="Unknown", lastTransitionTime="2026-09-21T10:04:58Z"
    )
    running = pod()
    waiting = pods.pod_status(running, lost_node, now=at + 10, margin_seconds=30)
    assert waiting.state.value == "running" and waiting.notice_at == at
    verdict = pods.classify_pod(running, lost_node, now=at + 61, margin_seconds=30)
    assert verdict.ended and verdict.forced and verdict.outcome == "preempted"
    assert not verdict.force_delete  # its node is still there
    gone = pods.classify_pod(
        running,
        None,
        now=at + 61,
        margin_seconds=30,
        earlier=[pods.Disruption("node-gone", "its node k-1 is gone", at=at)],
    )
    assert gone.ended and gone.force_delete
    stuck = pod(deleting=True)  # Terminating: deletionTimestamp 10:04:58, no kubelet answer
    assert not pods.pod_status(stuck, lost_node, now=at + 20, margin_seconds=30).ended
    assert pods.pod_status(stuck, lost_node, now=at + 31, margin_seconds=30).ended
    unknown = pod("Unknown")
    assert pods.classify_pod(unknown, now=at, margin_seconds=30).outcome == "running"


def test_a_vanished_pod_is_judged_by_what_was_seen_before_else_an_infrastructure_loss():
    assert outcome(None, None, notice_at=NOW - 5, spot=True) is Outcome.PREEMPTED
    assert outcome(None, None) is Outcome.INFRASTRUCTURE_FAILED
    tainted = node(
        "k-1", {}, taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
    )
    assert outcome(None, tainted) is Outcome.DISRUPTED
    assert outcome(None, None, completed=True) is Outcome.SUCCEEDED
    assert pods.pod_status(None, None, terminated_by_us=True, now=NOW).state.value == "terminated"


def test_waiting_for_a_bad_image_is_a_configuration_problem():
    bad = pod("Pending")
    bad["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}
    }
    assert pods.waiting_problem(bad) == 'ImagePullBackOff: Back-off pulling image "nope:1"'
    assert pods.waiting_problem(pod()) is None
    pending = pod("Pending")
    pending["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available",
            "lastTransitionTime": "2026-09-21T10:00:00Z",
        }
    ]
    assert pods.unschedulable_since(pending)[1] == "0/3 nodes are available"


# -- the in-pod detector --------------------------------------------------------------------
@pytest.mark.parametrize(
    "taint",
    [
        "karpenter.sh/disrupted",
        "node.kubernetes.io/unschedulable",
        "ToBeDeletedByClusterAutoscaler",
        "cloud.google.com/impending-node-termination",
    ],
)
def test_detector_fires_once_per_node_on_each_notice_taint(taint):
    tainted = node("k-1", {}, taints=[{"key": taint, "effect": "NoSchedule"}])
    detector = KubernetesNodeDetector("k-1", read_node=lambda name: tainted)
    (notice,) = detector.poll(NOW)
    assert notice.is_interruption and notice.cloud == "kubernetes"
    assert notice.key == detector.poll(NOW + 1)[0].key


def test_detector_is_quiet_on_a_healthy_node_and_survives_api_errors():
    assert node_notice(FLAVOUR_NODES["aks"]) is None  # the spot taint itself is no notice
    assert KubernetesNodeDetector("a-1", read_node=lambda n: FLAVOUR_NODES["aks"]).poll(NOW) == []

    def broken(name):
        raise OSError("connection refused")

    assert KubernetesNodeDetector("a-1", read_node=broken).poll(NOW) == []


# -- money and detector selection -----------------------------------------------------------
def test_a_pod_is_billed_per_second_of_its_life_on_its_node():
    from spot_core.model import Lease
    from spot_core.providers.kubernetes import KubernetesOptions, KubernetesProvider

    provider = KubernetesProvider(KubernetesOptions(), api=object())  # bill() calls no API
    pool = node_info(FLAVOUR_NODES["eks"]).pool
    lease = Lease(
        "spot-x-1-abcde",
        pool,
        "x",
        1,
        started_at=NOW,
        price_per_hour=0.072,
        details={"on_demand_price_per_hour": "0.192000"},
    )
    bill = provider.bill(lease, NOW + 1800.5)
    assert bill.capacity_seconds == 1800.5
    assert bill.cost == pytest.approx(0.072 * 1800.5 / 3600)
    assert bill.on_demand_cost == pytest.approx(0.192 * 1800.5 / 3600)


def test_auto_in_a_pod_of_the_provider_watches_its_node_and_sigterm(monkeypatch):
    from spot_core.interruption.selection import detectors_for
    from spot_core.interruption.signals import SignalDetector

    monkeypatch.setenv("SPOT_NODE_NAME", "k-1")
    found = detectors_for("auto", "http://127.0.0.1:9", timeout=0.2, probe_timeout=0.1)
    try:
        kinds = [type(d) for d in found]
        assert SignalDetector in kinds and KubernetesNodeDetector in kinds
        assert next(d for d in found if isinstance(d, KubernetesNodeDetector)).node_name == "k-1"
    finally:
        for detector in found:
            getattr(detector, "close", lambda: None)()
    monkeypatch.delenv("SPOT_NODE_NAME")
    with pytest.raises(ConfigError, match="SPOT_NODE_NAME"):
        detectors_for("kubernetes", "http://127.0.0.1:9", timeout=0.2, probe_timeout=0.1)


def test_the_provider_counts_a_disrupted_exit_zero_as_done_only_on_the_steps_final_checkpoint(
    tmp_path,
):
    """What the step left in its store decides: a final checkpoint of this very attempt."""
    from spot_core.checkpoint import open_store
    from spot_core.model import Lease
    from spot_core.providers.kubernetes import KubernetesOptions, KubernetesProvider

    provider = KubernetesProvider(KubernetesOptions(), api=object(), clock=lambda: NOW)
    pool = node_info(FLAVOUR_NODES["gke-spot"]).pool
    uri = (tmp_path / "ckpt").as_uri()
    lease = Lease(
        "spot-job-1-abcde",
        pool,
        "job",
        2,
        started_at=NOW - 60,
        price_per_hour=0.1,
        details={"checkpoint_uri": uri, "node": "g-1"},
    )
    cut_short = pod(
        "Succeeded",
        exit_code=0,
        status_reason="Terminated",
        message="Pod was terminated in response to imminent node shutdown.",
    )
    store = open_store(uri)
    store.save(step=5, payload={"w": b"1"}, metadata={"final": True}, attempt=1)
    assert classify(provider._status(lease, cut_short, {})) is Outcome.PREEMPTED  # not its own
    store.save(step=10, payload={"w": b"2"}, metadata={}, attempt=2)
    assert classify(provider._status(lease, cut_short, {})) is Outcome.PREEMPTED
    store.save(step=30, payload={"w": b"3"}, metadata={"final": True}, attempt=2)
    assert classify(provider._status(lease, cut_short, {})) is Outcome.SUCCEEDED
