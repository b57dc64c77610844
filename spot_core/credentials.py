"""What looks like a credential: by a variable's name, or by the shape of its value.

Credentials must never travel where others can read them: EC2 user-data (anyone with
ec2:DescribeInstanceAttribute), provider options (trigger kwargs, job variables, logs).
Values are judged too, because a harmless name (DATABASE_URL, MODEL_REPO) can hold a
password or a token. Nothing here ever quotes a value, so every reason is safe to print.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_NAME = re.compile(
    r"(SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|"
    r"API_KEY|APIKEY|AUTH|WEBHOOK)|(^|_)(PAT|KEY|DSN)(_|$)",
    re.I,
)
# Credential shapes, each with what it is; the value itself is never shown.
SECRET_VALUES = (
    (re.compile(r"[a-z][a-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@", re.I), "a URL with a password"),
    (re.compile(r"-----BEGIN [A-Z0-9 ]*-----"), "a PEM block"),
    (re.compile(r"\b(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"), "a GitHub token"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), "a GitHub token"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), "an OpenAI-style secret key"),
    (re.compile(r"hooks\.slack\.com/(services|workflows|triggers)/", re.I), "a Slack webhook"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\."), "a JSON web token"),
)


def secret_names(env: Mapping[str, str]) -> list[str]:
    """Names of variables that look like credentials, by name or by value."""
    return sorted(credential_findings(env))


def value_kind(text: str) -> str | None:
    """What kind of credential ``text`` holds (e.g. "a PEM block"), or None."""
    return next((what for pattern, what in SECRET_VALUES if pattern.search(text)), None)


def credential_findings(env: Mapping[str, str]) -> dict[str, str]:
    """Each suspicious variable's name -> why (its name, or the kind of value it holds)."""
    found = {}
    for name, value in env.items():
        if SECRET_NAME.search(name):
            found[name] = "its name"
            continue
        kind = value_kind(str(value))
        if kind:
            found[name] = f"holds {kind}"
    return found
