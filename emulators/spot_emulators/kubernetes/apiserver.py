"""The API server's semantics, without HTTP: create/get/list/update/patch/delete of the
served resources, the pod subresources (status, binding, eviction) and admission.

Pod deletion is graceful as documented: a bound, running pod gets ``deletionTimestamp``
and ``deletionGracePeriodSeconds`` and stays until its kubelet has stopped it; an
unscheduled or finished pod, or ``gracePeriodSeconds=0``, goes at once. An eviction
checks PodDisruptionBudgets (429 when one would be violated), adds the
``DisruptionTarget`` condition (reason ``EvictionByEvictionAPI``) and deletes gracefully.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import pod_defaults
from . import pod_status as ps
from .errors import ApiError, conflict, invalid, not_found, status_object
from .patch import apply_patch
from .resources import RESOURCES
from .scheduler import TERMINAL
from .selectors import (
    fields_match,
    label_selector_object,
    matches_all,
    parse_field_selector,
    parse_label_selector,
)
from .timefmt import rfc3339

if TYPE_CHECKING:
    from .store import Store

Cluster = Any  # a KubeCluster (cluster.py imports this module, so not imported here)

IMMUTABLE_META = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
)
STATUS_OWNED = ("pods", "nodes", "namespaces", "poddisruptionbudgets")
EVICTION_MESSAGE = "Eviction API: evicting"


class ApiServer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.store: Store = cluster.store

    # -- reads ---------------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        self._check_namespace(resource, namespace, must_exist=False)
        return self.store.get(resource, namespace, name)

    def list(
        self,
        resource: str,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> dict[str, Any]:
        """A list, paged with ``limit`` and ``continue`` as the API server pages it (the
        token carries the position; a token from another list is 400)."""
        items, rv = self.store.list(resource, namespace or None)
        keep = self.matcher(resource, label_selector, field_selector)
        res = RESOURCES[resource]
        items = sorted(
            (i for i in items if keep(i)),
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        start = _continue_position(continue_token, resource) if continue_token else None
        if start is not None:
            items = [
                i
                for i in items
                if (i["metadata"].get("namespace", ""), i["metadata"]["name"]) > start
            ]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps([resource, last.get("namespace", ""), last["name"]]).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": items,
        }

    def matcher(
        self, resource: str, label_selector: str | None, field_selector: str | None
    ) -> Callable[[Mapping[str, Any]], bool]:
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, resource)
        return lambda obj: (
            matches_all(labels, obj["metadata"].get("labels")) and fields_match(fields, obj)
        )

    # -- create --------------------------------------------------------------------------
    def create(self, resource: str, namespace: str, body: Any) -> dict[str, Any]:
        res = RESOURCES[resource]
        if not isinstance(body, dict):
            raise ApiError(400, f"the body of a create must be a {res.kind} object")
        if body.get("kind") not in (None, res.kind):
            raise ApiError(
                400,
                f"the API version in the data ({body.get('apiVersion')}) does "
                f"not match the expected API version ({res.api_version})",
            )
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        for key in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            meta.pop(key, None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = pod_defaults.generated_name(meta["generateName"])
        if res.namespaced:
            pod_defaults.require_namespace_match(namespace, obj)
            meta["namespace"] = namespace
            self._check_namespace(resource, namespace, must_exist=True)
        else:
            meta.pop("namespace", None)
        pod_defaults.check_name(res.kind, meta.get("name", ""))
        pod_defaults.check_labels(res.kind, meta["name"], meta.get("labels"))
        getattr(self, f"_admit_{resource}", lambda o: None)(obj)
        return self.store.create(resource, obj)

    def _admit_pods(self, pod: dict[str, Any]) -> None:
        pod_defaults.validate_pod(pod)
        self._admit_priority(pod)
        pod_defaults.default_pod(pod)
        pod["metadata"]["generation"] = 1

    def _admit_priority(self, pod: dict[str, Any]) -> None:
        """The Priority admission plugin: spec.priority from the pod's PriorityClass (or
        the global default one); an unknown class is refused."""
        spec, name = pod["spec"], pod["metadata"]["name"]
        classes = self.store.list("priorityclasses")[0]
        wanted = spec.get("priorityClassName")
        found = (
            next((c for c in classes if c["metadata"]["name"] == wanted), None)
            if wanted
            else next((c for c in classes if c.get("globalDefault")), None)
        )
        if wanted and found is None:
            raise ApiError(
                403,
                f'pods "{name}" is forbidden: no PriorityClass with name {wanted} was found',
                "Forbidden",
            )
        value = int(found.get("value", 0)) if found else 0
        if spec.get("priority") is not None and spec["priority"] != value:
            raise ApiError(
                403,
                f'pods "{name}" is forbidden: the integer value of priority '
                f"({spec['priority']}) must not be provided in pod spec; "
                "priority admission controller computed "
                f"{value} from the given PriorityClass name",
                "Forbidden",
            )
        spec["priority"] = value
        if found:
            spec["priorityClassName"] = found["metadata"]["name"]
            spec.setdefault(
                "preemptionPolicy", found.get("preemptionPolicy") or "PreemptLowerPriority"
            )

    def _admit_priorityclasses(self, klass: dict[str, Any]) -> None:
        if not isinstance(klass.get("value"), int):
            raise invalid("PriorityClass", klass["metadata"]["name"], [("value", "Required value")])

    def _admit_namespaces(self, namespace: dict[str, Any]) -> None:
        namespace["spec"] = {"finalizers": ["kubernetes"]}
        namespace["status"] = {"phase": "Active"}
        namespace["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = namespace[
            "metadata"
        ]["name"]

    def _admit_secrets(self, secret: dict[str, Any]) -> None:
        data = secret.setdefault("data", {})
        for key, value in (secret.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        secret.setdefault("type", "Opaque")

    def _admit_nodes(self, node: dict[str, Any]) -> None:
        node.setdefault("spec", {})
        node.setdefault("status", {})

    def _admit_events(self, event: dict[str, Any]) -> None:
        if not event.get("involvedObject"):
            raise invalid(
                "Event", event["metadata"]["name"], [("involvedObject", "Required value")]
            )

    def _check_namespace(self, resource: str, namespace: str, must_exist: bool) -> None:
        if not RESOURCES[resource].namespaced or not must_exist:
            return
        found = self.store.find("namespaces", "", namespace)
        if found is None:
            raise not_found("namespaces", namespace)
        if found["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{resource} "" is forbidden: unable to create new content '
                f"in namespace {namespace} because it is being terminated",
                "Forbidden",
            )

    # -- update and patch ----------------------------------------------------------------
    def replace(
        self, resource: str, namespace: str, name: str, body: Any, subresource: str | None = None
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of an update must be an object")
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        expect = (body.get("metadata") or {}).get("resourceVersion")
        return self.store.update(
            resource,
            namespace,
            name,
            lambda obj: self._merge_write(resource, obj, body, subresource),
            expect_rv=expect,
        )

    def patch(
        self,
        resource: str,
        namespace: str,
        name: str,
        body: Any,
        content_type: str,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        def mutate(obj: dict[str, Any]) -> None:
            patched = apply_patch(obj, body, content_type)
            expect = (patched.get("metadata") or {}).get("resourceVersion")
            if expect and expect != obj["metadata"]["resourceVersion"]:
                raise conflict(
                    resource,
                    name,
                    "the object has been modified; please apply "
                    "your changes to the latest version and try again",
                )
            self._merge_write(resource, obj, patched, subresource)

        return self.store.update(resource, namespace, name, mutate)

    def _merge_write(
        self, resource: str, obj: dict[str, Any], new: dict[str, Any], subresource: str | None
    ) -> None:
        """Write ``new`` over ``obj`` keeping what this endpoint may not change: the main
        resource never changes status (of types with a status subresource), the status
        subresource changes only status, and identity metadata never changes."""
        if subresource == "status":
            obj["status"] = copy.deepcopy(new.get("status") or {})
            return
        kept_meta = {k: obj["metadata"][k] for k in IMMUTABLE_META if k in obj["metadata"]}
        status = obj.get("status")
        node_name = (obj.get("spec") or {}).get("nodeName")
        obj.clear()
        obj.update(copy.deepcopy(new))
        obj.setdefault("metadata", {}).update(kept_meta)
        if resource in STATUS_OWNED:
            obj["status"] = status
            if obj["status"] is None:
                obj.pop("status")
        if resource == "pods":
            if node_name:
                obj["spec"]["nodeName"] = node_name
            pod_defaults.check_labels("Pod", obj["metadata"]["name"], obj["metadata"].get("labels"))
        res = RESOURCES[resource]
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        if resource == "secrets":
            self._admit_secrets(obj)

    # -- delete --------------------------------------------------------------------------
    def delete(
        self, resource: str, namespace: str, name: str, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        current = self.store.get(resource, namespace, name)
        self._check_preconditions(resource, current, options.get("preconditions") or {})
        if options.get("dryRun"):
            return current
        if resource == "pods":
            pod: dict[str, Any] = self.cluster.delete_pod(
                namespace, name, options.get("gracePeriodSeconds")
            )
            return pod
        if resource == "namespaces":
            namespace_object: dict[str, Any] = self.cluster.delete_namespace(name)
            return namespace_object
        return self.store.delete(resource, namespace, name)

    def delete_collection(
        self,
        resource: str,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        """``deletecollection``: each selected object deleted as a single delete would."""
        listed = self.list(resource, namespace, label_selector, field_selector)
        deleted = []
        for obj in listed["items"]:
            meta = obj["metadata"]
            try:
                deleted.append(
                    self.delete(
                        resource,
                        meta.get("namespace", ""),
                        meta["name"],
                        {k: v for k, v in options.items() if k != "preconditions"},
                    )
                )
            except ApiError as exc:
                if exc.code != 404:
                    raise
        listed["items"] = deleted
        return listed

    def _check_preconditions(
        self, resource: str, obj: Mapping[str, Any], preconditions: Mapping[str, Any]
    ) -> None:
        meta = obj["metadata"]
        for key in ("uid", "resourceVersion"):
            want = preconditions.get(key)
            if want and want != meta.get(key):
                raise conflict(
                    resource,
                    meta["name"],
                    f"Precondition failed: {key} in "
                    f"precondition: {want}, {key} in object meta: {meta.get(key)}",
                )

    # -- pod subresources ----------------------------------------------------------------
    def evict(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "the body of an eviction must be a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        pod = self.store.get("pods", namespace, name)
        options = body.get("deleteOptions") or {}
        self._check_preconditions("pods", pod, options.get("preconditions") or {})
        if pod["status"].get("phase") in TERMINAL:
            self.cluster.delete_pod(namespace, name, options.get("gracePeriodSeconds"))
            return status_object(201, failure=False)
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
            self._check_budgets(pod)
        self.cluster.mark_disruption(namespace, name, "EvictionByEvictionAPI", EVICTION_MESSAGE)
        self.cluster.delete_pod(namespace, name, options.get("gracePeriodSeconds"))
        return status_object(201, failure=False)

    def _check_budgets(self, pod: dict[str, Any]) -> None:
        namespace = pod["metadata"]["namespace"]
        if not _healthy(pod):
            return
        for pdb in self.store.list("poddisruptionbudgets", namespace)[0]:
            selector = label_selector_object((pdb.get("spec") or {}).get("selector"))
            if not matches_all(selector, pod["metadata"].get("labels")):
                continue
            members = [
                p
                for p in self.store.list("pods", namespace)[0]
                if matches_all(selector, p["metadata"].get("labels"))
            ]
            healthy = sum(1 for p in members if _healthy(p))
            needed = _pdb_needed(pdb["spec"], len(members))
            if healthy - 1 < needed:
                message = (
                    f"The disruption budget {pdb['metadata']['name']} needs {needed} "
                    f"healthy pods and has {healthy} currently"
                )
                raise ApiError(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    "TooManyRequests",
                    {"causes": [{"reason": "DisruptionBudget", "message": message}]},
                )

    def bind(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        target = (body or {}).get("target") or {}
        if not target.get("name"):
            raise invalid("Binding", name, [("target.name", "Required value")])
        self.cluster.bind(namespace, name, target["name"])
        return status_object(201, failure=False)


def _continue_position(token: str, resource: str) -> tuple[str, str]:
    try:
        kind, namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        raise ApiError(
            400,
            "continue key is not valid: incorrect encoded start "
            "resourceVersion (version meta.k8s.io/v1)",
        ) from None
    if kind != resource:
        raise ApiError(400, "continue key is not valid: it was issued for another list")
    return namespace, name


def _healthy(pod: Mapping[str, Any]) -> bool:
    ready = ps.condition(dict(pod), "Ready")
    return (
        not pod["metadata"].get("deletionTimestamp")
        and pod.get("status", {}).get("phase") == "Running"
        and ready is not None
        and ready["status"] == "True"
    )


def _pdb_needed(spec: Mapping[str, Any], members: int) -> int:
    def value(raw: Any) -> int:
        if isinstance(raw, str) and raw.endswith("%"):
            return -(-int(raw[:-1]) * members // 100)
        return int(raw)

    if spec.get("minAvailable") is not None:
        return value(spec["minAvailable"])
    if spec.get("maxUnavailable") is not None:
        return members - value(spec["maxUnavailable"])
    return 0


def deletion_fields(now: float, grace: float) -> dict[str, Any]:
    return {"deletionTimestamp": rfc3339(now + grace), "deletionGracePeriodSeconds": int(grace)}
