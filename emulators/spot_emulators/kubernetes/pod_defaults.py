"""What the API server does to a pod on create: validation (422) and defaulting.

Defaults are the ones clients read back: restartPolicy Always, a 30 s grace period, the
not-ready/unreachable tolerations of the DefaultTolerationSeconds admission plugin,
requests copied from limits, imagePullPolicy from the tag, phase Pending and the QoS class.
"""

from __future__ import annotations

import random
import re
from typing import Any

from .errors import ApiError, invalid
from .quantity import parse_quantity

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
RESTART_POLICIES = ("Always", "OnFailure", "Never")


def generated_name(prefix: str) -> str:
    """``generateName`` + 5 characters from the API server's alphabet."""
    return prefix + "".join(random.choice(_NAME_CHARS) for _ in range(5))


def check_name(kind: str, name: str) -> None:
    if not name:
        raise invalid(
            kind, name, [("metadata.name", "Required value: name or generateName is required")]
        )
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise invalid(
            kind,
            name,
            [
                (
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase '
                    "RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an "
                    "alphanumeric character",
                )
            ],
        )


def check_labels(kind: str, name: str, labels: dict[str, Any] | None) -> None:
    for value in (labels or {}).values():
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise invalid(
                kind,
                name,
                [
                    (
                        "metadata.labels",
                        f'Invalid value: "{value}": a valid '
                        "label must be an empty string or consist of "
                        "alphanumeric characters, '-', '_' or '.', and must "
                        "start and end with an alphanumeric character",
                    )
                ],
            )


def validate_pod(pod: dict[str, Any]) -> None:
    meta, spec = pod.get("metadata") or {}, pod.get("spec")
    name = meta.get("name", "")
    check_name("Pod", name)
    check_labels("Pod", name, meta.get("labels"))
    if not isinstance(spec, dict) or not spec.get("containers"):
        raise invalid("Pod", name, [("spec.containers", "Required value")])
    causes, seen = [], set()
    for index, container in enumerate(spec["containers"]):
        cname = container.get("name") or ""
        if not cname:
            causes.append((f"spec.containers[{index}].name", "Required value"))
        elif not _DNS_LABEL.match(cname):
            causes.append(
                (
                    f"spec.containers[{index}].name",
                    f'Invalid value: "{cname}": a '
                    "lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-'",
                )
            )
        elif cname in seen:
            causes.append((f"spec.containers[{index}].name", f'Duplicate value: "{cname}"'))
        seen.add(cname)
        if not container.get("image"):
            causes.append((f"spec.containers[{index}].image", "Required value"))
        causes += _resource_causes(index, container.get("resources") or {})
    policy = spec.get("restartPolicy", "Always")
    if policy not in RESTART_POLICIES:
        causes.append(
            (
                "spec.restartPolicy",
                f'Unsupported value: "{policy}": supported values: "Always", "OnFailure", "Never"',
            )
        )
    if causes:
        raise invalid("Pod", name, causes)


def _resource_causes(index: int, resources: dict[str, Any]) -> list[tuple[str, str]]:
    causes = []
    for kind in ("limits", "requests"):
        for resource, value in (resources.get(kind) or {}).items():
            try:
                parse_quantity(value)
            except ValueError as exc:
                causes.append(
                    (
                        f"spec.containers[{index}].resources.{kind}[{resource}]",
                        f'Invalid value: "{value}": {exc}',
                    )
                )
    return causes


def default_pod(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    for container in spec["containers"]:
        _default_container(container)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec["containers"])}
    return pod


def _default_container(container: dict[str, Any]) -> None:
    image = container["image"]
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for key, value in limits.items():
            requests.setdefault(key, value)


def qos_class(containers: list[dict[str, Any]]) -> str:
    requests = [c.get("resources", {}).get("requests") or {} for c in containers]
    limits = [c.get("resources", {}).get("limits") or {} for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(
        lim.get(r) is not None
        and req.get(r) is not None
        and parse_quantity(lim[r]) == parse_quantity(req[r])
        for req, lim in zip(requests, limits, strict=True)
        for r in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def require_namespace_match(path_namespace: str, obj: dict[str, Any]) -> None:
    body_ns = (obj.get("metadata") or {}).get("namespace")
    if body_ns and body_ns != path_namespace:
        raise ApiError(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
