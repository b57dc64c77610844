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


# Test files run after the rest of their suite, one test at a time, when `make test`
# spreads a suite over processes (tests/run_suite.py): each times real processes against
# a window of a few wall seconds, or starts many (moto's EC2, an instance runtime per
# lease), and failed or timed out beside three other workers on this 2-core machine.
SERIAL_FILES: dict[str, str] = {
    "test_ec2_provider.py": "instance runtimes on moto against 120 s timeouts",
    "test_ec2_bootstrap.py": "installs the package at an instance's boot",
    "test_clock_skew.py": "clocks offset per process, judged within a few seconds",
    "test_one_driver.py": "a take-over measured in heartbeats of 1-2 s",
    "test_run_kill.py": "a killed driver's leases ended within its timeout",
    "test_controller.py": "the preemption budget spent on a 1 s trace tick",
    "test_worker_notice.py": "an emergency save inside a notice of 1 wall second",
    "test_standalone_kubernetes.py": "a killed triggerer restarted within its lease",
}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the tests of SERIAL_FILES ``serial`` (before ``-m`` selects)."""
    if item.path.name in SERIAL_FILES:
        item.add_marker(pytest.mark.serial)
