"""Every test directory (tests/core, tests/airflow, tests/prefect): no silent skip in CI.

A skip hides a missing tool, package or data file as a green run. Under ``CI=true`` a
skipped test (in collection, setup or call) is reported as failed with its reason, unless
the reason is one of the deliberate platform skips below. Outside CI a skip stays a skip,
so a developer's laptop without, say, the docker CLI still runs the rest.
"""

from __future__ import annotations

import os

import pytest

# Skips that are right even in CI, matched as a substring of the skip's reason. Each must
# name a platform fact no installation can change. None are needed today.
DELIBERATE_SKIPS: tuple[str, ...] = ()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_reason(longrepr) -> str:
    """The reason of a skip report (pytest stores ``(path, line, "Skipped: reason")``)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _refused(reason: str) -> str | None:
    """The failure text for a skip that CI does not allow, or None when it is allowed."""
    if any(allowed in reason for allowed in DELIBERATE_SKIPS):
        return None
    return (
        f"skipped under CI=true ({reason}); a CI run must not skip: install what the "
        "test needs, or list a deliberate platform skip in tests/conftest.py"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        message = _refused(_skip_reason(report.longrepr))
        if message is not None:
            report.outcome = "failed"
            report.longrepr = message
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if _in_ci() and report.skipped:
        message = _refused(_skip_reason(report.longrepr))
        if message is not None:
            report.outcome = "failed"
            report.longrepr = message
    return report
