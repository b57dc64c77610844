"""Building blocks of ``pod.status`` as the kubelet and controllers write them: conditions
(lastTransitionTime moves only when the status flips) and container states."""

from __future__ import annotations

import hashlib
from typing import Any

from .timefmt import rfc3339


def set_condition(
    status: dict[str, Any],
    type_: str,
    value: str,
    now: float,
    reason: str | None = None,
    message: str | None = None,
) -> None:
    conditions = status.setdefault("conditions", [])
    current = next((c for c in conditions if c["type"] == type_), None)
    entry = {
        "type": type_,
        "status": value,
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(now),
    }
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    if current is None:
        conditions.append(entry)
        return
    if current["status"] == value:
        entry["lastTransitionTime"] = (
            current.get("lastTransitionTime") or entry["lastTransitionTime"]
        )
    current.clear()
    current.update(entry)


def condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == type_), None
    )


def normalized_image(image: str) -> str:
    """``busybox`` -> ``docker.io/library/busybox:latest``, as containerd reports it."""
    name, digest = (image.split("@", 1) + [""])[:2]
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if digest:
        return f"{name}@{digest}"
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def image_id(image: str) -> str:
    ref = normalized_image(image)
    repo = ref.split("@", 1)[0].rsplit(":", 1)[0] if "@" not in ref else ref.split("@")[0]
    return f"{repo}@sha256:{hashlib.sha256(ref.encode()).hexdigest()}"


def waiting(
    name: str,
    image: str,
    reason: str,
    message: str | None = None,
    restart_count: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    state = {"reason": reason}
    if message:
        state["message"] = message
    status = {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": False,
        "restartCount": restart_count,
        "started": False,
        "state": {"waiting": state},
        "lastState": last or {},
    }
    return status


def running(
    name: str,
    image: str,
    container_id: str,
    started: float,
    restart_count: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": image_id(image),
        "containerID": f"containerd://{container_id}",
        "ready": True,
        "restartCount": restart_count,
        "started": True,
        "state": {"running": {"startedAt": rfc3339(started)}},
        "lastState": last or {},
    }


def terminated_state(
    container_id: str,
    exit_code: int,
    reason: str,
    started: float,
    finished: float,
    signal: int | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    state = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": rfc3339(started),
        "finishedAt": rfc3339(finished),
        "containerID": f"containerd://{container_id}",
    }
    if signal:
        state["signal"] = signal
    if message:
        state["message"] = message
    return {"terminated": state}


def terminated(
    name: str,
    image: str,
    container_id: str,
    state: dict[str, Any],
    restart_count: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": image_id(image),
        "containerID": f"containerd://{container_id}",
        "ready": False,
        "restartCount": restart_count,
        "started": False,
        "state": state,
        "lastState": last or {},
    }
