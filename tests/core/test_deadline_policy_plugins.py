"""A user's own deadline policy, named by an installed package's entry point
(``spot_pipelines.deadline_policies``): found by name by a fresh process without any import
of it first, run by the simulator like a built-in one, and a broken entry point refused in
one line that names the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

POLICIES = textwrap.dedent('''
    """A package of deadline policies, as a team would install it."""
    from spot_core.policy.deadline.base import ON_DEMAND


    class EveryTickOnDemand:
        """What the built-in ``on-demand`` does, written as a user would."""

        def plan(self, window):
            return lambda t, progress, current, left: ON_DEMAND


    not_a_policy = 42
''')
ENTRY_POINTS = textwrap.dedent("""
    [spot_pipelines.deadline_policies]
    team-on-demand = team_policies:EveryTickOnDemand
    missing = team_policies_not_installed:Policy
    no-plan = team_policies:not_a_policy
""")


def _install(folder) -> str:
    """The package and its dist-info on a path entry (what ``pip install`` leaves)."""
    folder.mkdir()
    (folder / "team_policies.py").write_text(POLICIES)
    info = folder / "team_policies-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-policies\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return str(folder)


def _trace(tmp_path):
    start = np.datetime64("2023-02-15T00:00:00")
    lines = ["date,availability"] + [
        f"{str(start + np.timedelta64(600 * i, 's')).replace('T', ' ')},{int(i % 5 != 2)}"
        for i in range(60)
    ]
    path = tmp_path / "us-east-1a_v100_1.csv"
    path.write_text("\n".join(lines) + "\n")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"us-east-1a_v100_1": [1.0] * 60}))
    return [
        "--trace",
        str(path),
        "--prices",
        str(prices),
        "--task-hours",
        "2",
        "--deadline-hours",
        "4",
        "--restart-overhead-hours",
        "0.1",
        "--start-tick",
        "0",
        "--start-tick",
        "20",
        "--json",
    ]


def _simulate(tmp_path, plugins: str, policy: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([plugins, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "simulate", *_trace(tmp_path), "--policy", policy],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def test_an_installed_policy_is_found_by_name_and_simulated(tmp_path):
    plugins = _install(tmp_path / "site")
    mine = _simulate(tmp_path, plugins, "team-on-demand")
    assert mine.returncode == 0, mine.stderr
    builtin = _simulate(tmp_path, plugins, "on-demand")
    assert builtin.returncode == 0, builtin.stderr
    assert json.loads(mine.stdout)["costs"] == json.loads(builtin.stdout)["costs"]
    assert json.loads(mine.stdout)["policy"] == "team-on-demand"


def test_broken_entry_points_are_one_line_errors_that_name_the_fix(tmp_path):
    plugins = _install(tmp_path / "site")
    missing = _simulate(tmp_path, plugins, "missing")
    assert missing.returncode == 2
    line = missing.stderr.strip()
    assert "\n" not in line and "deadline policy 'missing'" in line
    assert "could not be loaded: ModuleNotFoundError" in line
    assert "install its package in this environment" in line
    no_plan = _simulate(tmp_path, plugins, "no-plan").stderr.strip()
    assert "\n" not in no_plan and "has no plan() method" in no_plan
    unknown = _simulate(tmp_path, plugins, "nope").stderr.strip()
    assert "team-on-demand" in unknown, "the installed names are among the choices"
