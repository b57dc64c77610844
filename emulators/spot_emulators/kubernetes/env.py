"""A container's environment as the kubelet builds it from the pod spec.

``value`` (with ``$(VAR)`` expansion), ``valueFrom`` fieldRef / secretKeyRef /
configMapKeyRef / resourceFieldRef and ``envFrom``. A missing secret, config map or key
is the kubelet's CreateContainerConfigError, carrying the kubelet's message.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

from .quantity import parse_quantity

Lookup = Callable[[str, str, str], "Mapping[str, Any] | None"]  # (resource, ns, name)
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ContainerConfigError(Exception):
    """The container cannot be created from its spec (CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` references: defined ones replaced, ``$$`` -> ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REF.sub(sub, text)


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(_env_from(source, namespace, lookup))
    for var in container.get("env") or []:
        if "valueFrom" in var and var["valueFrom"]:
            value = _value_from(var["valueFrom"], pod, container, namespace, lookup)
            if value is None:
                continue
            env[var["name"]] = value
        else:
            env[var["name"]] = expand(str(var.get("value") or ""), env)
    return env


def _env_from(source: Mapping[str, Any], namespace: str, lookup: Lookup) -> dict[str, str]:
    prefix = source.get("prefix") or ""
    for field, resource, kind in (
        ("configMapRef", "configmaps", "configmap"),
        ("secretRef", "secrets", "secret"),
    ):
        ref = source.get(field)
        if ref:
            obj = lookup(resource, namespace, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    return {}
                raise ContainerConfigError(f'{kind} "{ref["name"]}" not found')
            return {prefix + k: v for k, v in _data(obj, resource).items()}
    return {}


def _value_from(
    source: Mapping[str, Any],
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    namespace: str,
    lookup: Lookup,
) -> str | None:
    if "fieldRef" in source and source["fieldRef"]:
        return _field_ref(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source and source["resourceFieldRef"]:
        return _resource_ref(container, source["resourceFieldRef"])
    for field, resource, kind, title in (
        ("secretKeyRef", "secrets", "secret", "Secret"),
        ("configMapKeyRef", "configmaps", "configmap", "ConfigMap"),
    ):
        ref = source.get(field)
        if not ref:
            continue
        obj = lookup(resource, namespace, ref["name"])
        data = _data(obj, resource) if obj is not None else None
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            if data is None:
                raise ContainerConfigError(f'{kind} "{ref["name"]}" not found')
            raise ContainerConfigError(
                f"couldn't find key {ref['key']} in {title} {namespace}/{ref['name']}"
            )
        return data[ref["key"]]
    return ""


def _data(obj: Mapping[str, Any], resource: str) -> dict[str, str]:
    if resource == "secrets":
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    return dict(obj.get("data") or {})


def _field_ref(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        labelled: str = (meta.get(match.group(1)) or {}).get(match.group(2), "")  # pod JSON
        return labelled
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": status.get("podIP", ""),
    }
    if path not in values:
        raise ContainerConfigError(f"unsupported fieldPath: {path}")
    value: str = values[path]  # the pod's JSON
    return value


def _resource_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, resource = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(resource)
    if value is None:
        return "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    number = parse_quantity(value) / divisor
    return str(int(-(-number // 1)))  # rounded up, as the kubelet does
