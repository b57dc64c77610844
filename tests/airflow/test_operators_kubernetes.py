"""SpotKubernetesPodOperator at parse time, its trigger's round trip, and the Kubernetes
connection resolved through cncf-kubernetes' KubernetesHook (no cluster needed here;
tests/airflow/test_operator_kubernetes.py runs the operator against the emulator)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import stat
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_spot.hooks.kubernetes import SpotKubernetesHook, _resolve
from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator
from airflow_spot.triggers.kubernetes import SpotKubernetesPodTrigger
from spot_core.controller import Next
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, Pool
from spot_core.settings import KNOBS_BY_NAME, POD_OPERATOR, SpotSettings, knobs_for

GOOD = {
    "image": "ghcr.io/acme/train:1.4",
    "cmds": ["python", "-m", "train"],
    "checkpoint_uri": "s3://ml-ckpt/train",
}
POD_KNOBS = knobs_for(POD_OPERATOR)


def _operator(task_id: str = "train", **kwargs) -> SpotKubernetesPodOperator:
    with DAG(f"kpo_{task_id}", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotKubernetesPodOperator(task_id=task_id, **{**GOOD, **kwargs})


BAD_CASES = [
    ({"cmds": None}, "train: cmds is required"),
    ({"do_xcom_push": True}, "do_xcom_push=True .* is not supported on spot pods"),
    ({"on_finish_action": "keep_pod"}, "on_finish_action='keep_pod': every spot attempt's pod"),
    ({"on_kill_action": "keep_pod"}, "on_kill_action='keep_pod'"),
    ({"provider_options": {"kubeconfig": "/x"}}, r"provider_options \['kubeconfig'\] come from"),
    ({"provider_options": {"pod_template": {}}}, r"provider_options \['pod_template'\] come from"),
    ({"provider_options": {"colour": "red"}}, "unknown kubernetes provider option"),
    ({"provider_options": {"unschedulable_timeout": 0}}, "unschedulable_timeout=0 must be"),
    ({"provider_options": "namespace=ml"}, "provider_options='namespace=ml' must be a mapping"),
    ({"checkpoint_uri": "gs://bucket/x"}, "unsupported scheme 'gs'"),
    ({"checkpoint_uri": "file:///data/ckpt"}, "on this machine's disk, which the pods cannot"),
    ({"node_pools": "spot-a"}, "node_pools='spot-a' must be a list of names"),
    ({"zones": "us-east-1a"}, "zones='us-east-1a' must be a list of names"),
    ({"max_preemptions": -1}, "train: max_preemptions=-1 must be >= 0"),
    ({"poll_interval": 0}, "poll_interval=0 must be > 0s"),
    ({"deferrable": "yes"}, "deferrable='yes' must be True or False"),
    ({"reattach_on_restart": False}, "reattach_on_restart=False: a spot job always picks up"),
    ({"durable": False}, "durable=False: a spot job always picks up"),
    ({"startup_timeout_seconds": 0}, "startup_timeout_seconds=0: .*must be a number of seconds"),
    (
        {"schedule_timeout_seconds": 30, "provider_options": {"unschedulable_timeout": 60}},
        r"\['schedule_timeout_seconds'\] and provider_options \['unschedulable_timeout'\]",
    ),
]


@pytest.mark.parametrize(
    ("override", "message"),
    BAD_CASES,
    ids=[f"{next(iter(o))}-{i}" for i, (o, _) in enumerate(BAD_CASES)],
)
def test_bad_parameters_raise_value_error_at_parse_time(override, message):
    with pytest.raises(ValueError, match=message) as info:
        _operator(**override)
    assert "\n" not in str(info.value)


def test_kpo_callbacks_are_refused_at_parse_time():
    from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback

    class Notify(KubernetesPodOperatorCallback):
        pass

    with pytest.raises(ValueError, match="callbacks=.* cannot run: each spot attempt's pod"):
        _operator(callbacks=Notify)


def test_kpo_timeouts_are_honoured_as_the_providers_options():
    """KPO's startup and schedule timeouts mean the provider's start_timeout and
    unschedulable_timeout: what the provider is opened with, not dropped."""
    op = _operator(
        startup_timeout_seconds=300,
        schedule_timeout_seconds=45,
        provider_options={"prices": {"m5.xlarge": {"spot": 0.07}}},
    )
    assert op.provider_options == {
        "prices": {"m5.xlarge": {"spot": 0.07}},
        "start_timeout": 300,
        "unschedulable_timeout": 45,
    }
    assert _operator().provider_options == {}  # not given: the provider's own defaults
    assert _operator(reattach_on_restart=True).provider_options == {}


def test_a_file_store_on_a_mounted_volume_is_accepted():
    from kubernetes.client import models as k8s

    op = _operator(
        checkpoint_uri="file:///mnt/ckpt/train",
        volumes=[
            k8s.V1Volume(
                name="ckpt",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name="ckpt"),
            )
        ],
        volume_mounts=[k8s.V1VolumeMount(name="ckpt", mount_path="/mnt/ckpt")],
    )
    assert op.checkpoint_uri == "file:///mnt/ckpt/train"


def test_the_operator_keeps_kpos_parameters_and_templates():
    op = _operator(
        namespace="ml",
        env_vars={"A": "{{ ds }}"},
        arguments=["--day", "{{ ds }}"],
        labels={"team": "ml"},
        kubernetes_conn_id="k8s",
        deferrable=True,
        checkpoint_uri="s3://ckpt/{{ ds_nodash }}",
        max_preemptions=2,
    )
    assert {
        "image",
        "cmds",
        "arguments",
        "env_vars",
        "namespace",
        "kubernetes_conn_id",
        "pod_template_file",
        "checkpoint_uri",
        "provider_options",
    } <= set(op.template_fields)
    assert (op.namespace, op.kubernetes_conn_id, op.deferrable) == ("ml", "k8s", True)
    assert op.settings.provider == "kubernetes" and op.policy.max_preemptions == 2
    kpo = inspect.signature(SpotKubernetesPodOperator.__mro__[2].__init__).parameters
    assert {"image", "cmds", "container_resources", "volumes", "pod_template_file"} <= set(kpo)


def test_the_surface_exposes_exactly_its_knobs_with_the_models_defaults():
    params = inspect.signature(SpotKubernetesPodOperator.__init__).parameters
    assert set(params) & set(KNOBS_BY_NAME) == {k.name for k in POD_KNOBS}
    op = _operator()
    for k in POD_KNOBS:
        if k.kind != "mapping":
            assert params[k.name].default == k.default, k.name
        assert k.read(op.settings) == k.default, k.name
    assert "provider" not in params and "image" not in {k.name for k in POD_KNOBS}


@pytest.mark.parametrize("k", POD_KNOBS, ids=[k.name for k in POD_KNOBS])
def test_the_operator_refuses_what_the_model_refuses(k):
    from test_settings_surfaces import _bad

    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: _bad(k)})
    with pytest.raises(ValueError) as info:
        _operator(task_id=f"t_{k.name}", **{k.name: _bad(k)})
    assert str(info.value).startswith(f"t_{k.name}: ") and "\n" not in str(info.value)


# -- the trigger ----------------------------------------------------------------------------------
def _next() -> dict:
    record = JobRecord(job_id="dag.train.run", created_at=1.0e9, checkpoint_uri="file:///c")
    lease = {
        "lease_id": "spot-dag-train-run-1-abcde",
        "pool": Pool("kubernetes", "us-east-1", "us-east-1a", "m5.xlarge").to_dict(),
        "job_id": "dag.train.run",
        "attempt": 1,
        "started_at": 1.0e9,
        "price_per_hour": 0.05,
        "details": {"namespace": "ml", "node": "n1"},
    }
    return {
        "action": "watch",
        "record": record.to_dict(),
        "until": 2.0e9,
        "lease": lease,
        "reason": "",
        "failing_since": None,
        "notice_at": None,
    }


TRIGGER = dict(
    provider_options={
        "namespace": "ml",
        "pod_template": {"spec": {"containers": [{"name": "base", "image": "python:3.11"}]}},
    },
    next=_next(),
    checkpoint_uri="file:///c",
    controller_options={"poll_interval": 0.5},
    not_before=1.0e9,
    kubernetes_conn_id="k8s",
    cluster_context="emu",
    in_cluster=None,
    config_file=None,
)


def test_the_trigger_names_its_own_class_and_round_trips():
    from airflow.serialization.serialized_objects import BaseSerialization

    trigger = SpotKubernetesPodTrigger(**TRIGGER)
    path, kwargs = trigger.serialize()
    assert path == "airflow_spot.triggers.kubernetes.SpotKubernetesPodTrigger"
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert BaseSerialization.deserialize(BaseSerialization.serialize(kwargs)) == kwargs
    assert Next.from_dict(kwargs["next"]).lease.details["namespace"] == "ml"
    assert kwargs["kubernetes_conn_id"] == "k8s" and "kubeconfig" not in kwargs["provider_options"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"provider": "local"}, "watches 'kubernetes' leases only"),
        ({"kubernetes_conn_id": ""}, "kubernetes_conn_id='' must be a non-empty string"),
        ({"in_cluster": "yes"}, "in_cluster='yes' must be True, False or None"),
        ({"provider_options": {"colour": "red"}}, "unknown kubernetes provider option"),
        ({"next": {**_next(), "action": "finished"}}, "a trigger watches or sleeps only"),
    ],
)
def test_the_trigger_refuses_forged_kwargs_in_one_line(override, message):
    with pytest.raises(ValueError, match=message) as info:
        SpotKubernetesPodTrigger(**{**TRIGGER, **override})
    assert "\n" not in str(info.value)


# -- the connection -------------------------------------------------------------------------------
def _hook(conn_id: str, extra: dict, monkeypatch, **kwargs):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kubernetes", "extra": extra})
    )
    return KubernetesHook(conn_id=conn_id, **kwargs)


def test_the_connection_becomes_provider_options_in_every_field_spelling(monkeypatch, tmp_path):
    old = _hook(
        "k_old",
        {
            "extra__kubernetes__kube_config_path": "/etc/kube/config",
            "extra__kubernetes__cluster_context": "emu",
        },
        monkeypatch,
    )
    assert _resolve(old) == {"kubeconfig": "/etc/kube/config", "context": "emu"}
    new = _hook(
        "k_new", {"kube_config_path": "/etc/kube/config"}, monkeypatch, cluster_context="other"
    )
    assert _resolve(new) == {"kubeconfig": "/etc/kube/config", "context": "other"}
    assert _resolve(_hook("k_in", {"in_cluster": True}, monkeypatch)) == {"in_cluster": True}
    operator_file = _hook("k_none", {}, monkeypatch, config_file=str(tmp_path / "kc"))
    assert _resolve(operator_file) == {"kubeconfig": str(tmp_path / "kc")}


def test_an_inline_kubeconfig_goes_to_a_private_file_never_to_options(monkeypatch):
    contents = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": "u", "user": {"token": "not-a-real-token-but-private"}}],
    }
    options = _resolve(_hook("k_inline", {"kube_config": contents}, monkeypatch))
    path = options["kubeconfig"]
    assert json.loads(open(path).read()) == contents
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "not-a-real-token" not in json.dumps(options)


def test_exclusive_connection_fields_are_one_line(monkeypatch):
    hook = _hook("k_both", {"kube_config_path": "/a", "in_cluster": True}, monkeypatch)
    with pytest.raises(ValueError, match="mutually exclusive"):
        _resolve(hook)


def test_the_hook_keeps_cluster_options_out_of_what_it_hands_on(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_K_HOOK",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": "/nowhere/config"}}),
    )
    hook = SpotKubernetesHook({"namespace": "ml"}, kubernetes_conn_id="k_hook")
    assert hook.provider_options == {"namespace": "ml", "kubeconfig": "/nowhere/config"}
    with pytest.raises(ValueError, match="say how to reach the cluster"):
        SpotKubernetesHook({"kubeconfig": "/x"}, kubernetes_conn_id="k_hook")
