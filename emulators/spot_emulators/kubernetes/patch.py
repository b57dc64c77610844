"""The three patch formats the API server accepts: JSON merge (RFC 7386), strategic merge
(merge by key for the lists that declare one) and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError

# List fields that merge by a key under strategic merge patch (from the Go types' tags).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "addresses": "type",
}
PRIMITIVE_SET_LISTS = {"finalizers"}

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """A new object: ``target`` (left untouched) with ``patch`` applied."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(
                400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise ApiError(400, "the body of a merge patch must be a JSON object")
    if kind == MERGE:
        merged: dict[str, Any] = merge_patch(target, patch)  # an object: patch is one
        return merged
    if kind == STRATEGIC:
        strategic: dict[str, Any] = strategic_merge(target, patch)  # likewise
        return strategic
    raise ApiError(
        415,
        f'the media type "{kind}" is not supported by this emulator: use '
        f"{STRATEGIC}, {MERGE} or {JSON_PATCH}",
    )


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: v for k, v in patch.items() if k != "$patch"}
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge(result.get(key), value, key)
        return result
    if isinstance(patch, list) and isinstance(target, list):
        if field in MERGE_KEYS:
            return _merge_list(target, patch, MERGE_KEYS[field])
        if field in PRIMITIVE_SET_LISTS:
            return list(target) + [v for v in patch if v not in target]
    return copy.deepcopy(patch)


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    result = copy.deepcopy(target)
    for op in operations:
        name, path = op.get("op"), op.get("path", "")
        if name in ("add", "replace", "test"):
            value = copy.deepcopy(op.get("value"))
        if name == "test":
            if _pointer_get(result, path) != value:
                raise ApiError(422, f"testing value {path} failed")
        elif name == "remove":
            _pointer_remove(result, path)
        elif name in ("add", "replace"):
            if name == "replace":
                _pointer_get(result, path)
            result = _pointer_set(result, path, value, insert=name == "add")
        elif name in ("move", "copy"):
            value = copy.deepcopy(_pointer_get(result, op.get("from", "")))
            if name == "move":
                _pointer_remove(result, op.get("from", ""))
            result = _pointer_set(result, path, value, insert=True)
        else:
            raise ApiError(400, f"Unexpected kind: {name}")
    return result


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, f"JSON pointer must start with '/': {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise ApiError(422, "the root of the document cannot be patched this way")
    current = doc
    for token in tokens[:-1]:
        current = _step(current, token, path)
    return current, tokens[-1]


def _step(current: Any, token: str, path: str) -> Any:
    try:
        return current[int(token)] if isinstance(current, list) else current[token]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, f'doc is missing path: "{path}"') from None


def _pointer_get(doc: Any, path: str) -> Any:
    current = doc
    for token in _tokens(path):
        current = _step(current, token, path)
    return current


def _pointer_set(doc: Any, path: str, value: Any, insert: bool) -> Any:
    if not _tokens(path):
        return value
    parent, last = _parent(doc, path)
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if insert:
            parent.insert(index, value)
        else:
            parent[index] = value
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, f'doc is missing path: "{path}"')
    return doc


def _pointer_remove(doc: Any, path: str) -> None:
    parent, last = _parent(doc, path)
    try:
        if isinstance(parent, list):
            parent.pop(int(last))
        else:
            del parent[last]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, f"unable to remove nonexistent key: {last}: missing value") from None
