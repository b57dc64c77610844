"""API errors as the Kubernetes API server sends them: a ``Status`` object with a code.

Clients (``kubernetes``, ``kubernetes_asyncio``, cncf-kubernetes) branch on ``code`` and
``reason``, so every failure the emulator answers is one of these, never a bare string.
"""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


class ApiError(Exception):
    """An answer other than success; ``status()`` is the body the API server would send."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.message, self.reason, self.details, failure=True)


def status_object(
    code: int,
    message: str = "",
    reason: str = "",
    details: dict[str, Any] | None = None,
    *,
    failure: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if failure else "Success",
        "code": code,
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    return body


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        404,
        f'{resource}{"." + group if group else ""} "{name}" not found',
        details=_details(resource, name, group),
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        409,
        f'{resource}{"." + group if group else ""} "{name}" already exists',
        "AlreadyExists",
        _details(resource, name, group),
    )


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        "Conflict",
        _details(resource, name, ""),
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 with one cause per (field, message), e.g. ("spec.containers", "Required value")."""
    text = ", ".join(f"{field}: {msg}" for field, msg in causes)
    if len(causes) > 1:
        text = f"[{text}]"
    return ApiError(
        422,
        f'{kind} "{name}" is invalid: {text}',
        "Invalid",
        {
            "name": name,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": msg, "field": field}
                for field, msg in causes
            ],
        },
    )


def _details(resource: str, name: str, group: str) -> dict[str, Any]:
    details = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details
