"""Label and field selectors, as list/watch take them and as pod specs and PDBs hold them.

String selectors (``?labelSelector=app=x,tier notin (a,b),!gpu``) follow the grammar of
k8s.io/apimachinery/pkg/labels; field selectors support ``=``, ``==`` and ``!=`` on the
fields the real API server indexes for each resource (anything else is 400, as there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

_SET_OP = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_EQ_OP = re.compile(r"^\s*([^!=\s]+)\s*(==|!=|=)\s*(\S*)\s*$")

FIELDS = {
    "pods": (
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
        "spec.hostNetwork",
    ),
    "nodes": ("metadata.name", "spec.unschedulable"),
    "events": (
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "secrets": ("metadata.name", "metadata.namespace", "type"),
}
DEFAULT_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Equals, NotEquals, Gt, Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present, value = self.key in labels, labels.get(self.key)
        if self.operator in ("In", "Equals"):
            return present and value in self.values
        if self.operator in ("NotIn", "NotEquals"):
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt"):
            return present and _compare(value, self.values, self.operator)
        raise ApiError(400, f"{self.operator!r} is not a valid selector operator")


def _compare(value: str | None, values: tuple[str, ...], operator: str) -> bool:
    try:
        have, want = int(value or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return have > want if operator == "Gt" else have < want


def parse_label_selector(text: str | None) -> list[Requirement]:
    """``a=b,c!=d,e in (f,g),h notin (i),j,!k`` -> requirements; 400 on a bad one."""
    requirements = []
    for term in _split_terms(text or ""):
        requirements.append(_parse_term(term))
    return requirements


def _split_terms(text: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def _parse_term(term: str) -> Requirement:
    if match := _SET_OP.match(term):
        values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
        return Requirement(match.group(1), "In" if match.group(2) == "in" else "NotIn", values)
    if match := _EQ_OP.match(term):
        operator = "NotEquals" if match.group(2) == "!=" else "Equals"
        return Requirement(match.group(1), operator, (match.group(3),))
    if term.startswith("!") and " " not in term:
        return Requirement(term[1:], "DoesNotExist")
    if re.fullmatch(r"[A-Za-z0-9./_-]+", term):
        return Requirement(term, "Exists")
    raise ApiError(
        400, f"unable to parse requirement: found '{term}', expected: '=', '!=', '==', 'in', notin'"
    )


def matches_all(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


def label_selector_object(selector: Mapping[str, Any] | None) -> list[Requirement]:
    """A ``LabelSelector`` (matchLabels + matchExpressions) as requirements."""
    selector = selector or {}
    found = [Requirement(k, "Equals", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        found.append(
            Requirement(
                expression["key"], expression["operator"], tuple(expression.get("values") or ())
            )
        )
    return found


def parse_field_selector(text: str | None, resource: str) -> list[tuple[str, bool, str]]:
    """``spec.nodeName=n1,status.phase!=Failed`` -> (field, equal?, value) triples."""
    allowed = FIELDS.get(resource, DEFAULT_FIELDS)
    found = []
    for term in _split_terms(text or ""):
        match = _EQ_OP.match(term)
        if not match:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{term}'")
        field = match.group(1)
        if field not in allowed:
            raise ApiError(400, f"field label not supported: {field}")
        found.append((field, match.group(2) != "!=", match.group(3)))
    return found


def field_value(obj: Mapping[str, Any], field: str) -> str:
    """The string the API server compares for ``field`` (missing -> empty string)."""
    if field == "source":
        source = obj.get("source") or {}
        component: str = source.get("component", "")  # the event's JSON
        return component
    current: Any = obj
    for part in field.split("."):
        current = current.get(part) if isinstance(current, Mapping) else None
    if isinstance(current, bool):
        return "true" if current else "false"
    return "" if current is None else str(current)


def fields_match(terms: list[tuple[str, bool, str]], obj: Mapping[str, Any]) -> bool:
    return all((field_value(obj, f) == v) == equal for f, equal, v in terms)
