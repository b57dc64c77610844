"""The on-instance half of the EC2 provider: user-data, and the attempt's status object.

User-data (``user_data``) exports the attempt's variables, runs the step under
``spot-pipelines watch --report -- CMD`` (which forwards the interruption notice from
IMDSv2 to the step, and writes it to the job's store the moment it sees it), then reports
how the step ended (``python -m spot_core.providers.ec2_agent report``), and powers the
instance off (``InstanceInitiatedShutdownBehavior=terminate`` makes that a termination, so
a finished attempt stops costing money even if the controller is gone).

The report is a small JSON object written next to the checkpoints, at
``status/attempt-NNNNNN.json``: exit code, when the watcher saw a notice and the deadline
it gave, when the step ended (``spot_core.checkpoint.status``). The watcher writes it at
the first notice and again when the step ends, as the kubernetes provider's pods do, since
a reclaimed node may not live to run anything after its step; the agent writes it once
more after the step (a watcher that never started reports nothing). The provider reads it
while a spot instance runs, which is how ``handover=on_notice`` learns of the notice
without an EventBridge queue (EC2's own API says nothing of it before the instance is
gone), and once the instance is gone, to tell "the step exited 0" from "the node was
reclaimed" when EC2's own state reason is ambiguous. It needs ``s3:PutObject`` on the
checkpoint prefix, which the instance profile has anyway; no credential ever appears in
user-data.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core import attempt_env
from spot_core.checkpoint.status import (  # noqa: F401 - the agent's report
    STATUS_PREFIX,
    parse_report,
    status_key,
    write_report,
)
from spot_core.providers.ec2_bootstrap import Bootstrap

WATCH_LOG = "/var/log/spot-pipelines-watch.log"
# Powers the instance off (a termination, by the launch's shutdown behaviour); the
# instance runtime emulator replaces it.
SHUTDOWN = "${SPOT_SHUTDOWN_COMMAND:-shutdown -h now}"


def user_data(
    *,
    command: Sequence[str],
    environ: Mapping[str, str],
    watch_command: str,
    agent_python: str,
    poll_interval: float = 1.0,
    bootstrap: Bootstrap | None = None,
) -> str:
    """The cloud-init shell script that runs one attempt (no credentials in it, ever);
    with ``bootstrap``, it first installs spot-pipelines (``ec2_bootstrap``)."""
    exports = "\n".join(
        f"export {name}={shlex.quote(value)}" for name, value in sorted(environ.items())
    )
    step = " ".join(shlex.quote(word) for word in command)
    return f"""#!/bin/bash
# spot-pipelines attempt launcher. Credentials come from the instance profile, never from here.
set -u
# On SIGTERM (the instance shutting down) keep going long enough to report how the step
# ended; a trap with a command, unlike an ignored signal, is not inherited by the step.
trap 'true' TERM
{exports}
{bootstrap.shell(SHUTDOWN) if bootstrap else ""}LOG="${{SPOT_WATCH_LOG:-{WATCH_LOG}}}"
{watch_command} watch --cloud aws --report --poll-interval {poll_interval:g} -- {step} 2>&1 \\
    | tee -a "$LOG"
rc=${{PIPESTATUS[0]}}
{shlex.quote(agent_python)} -m spot_core.providers.ec2_agent report \\
    --exit-code "$rc" --watch-log "$LOG" || true
{SHUTDOWN}
"""


def first_notice(log_path: str) -> tuple[float, float | None] | None:
    """(when, deadline) of the first interruption event the watcher printed, from its JSON
    lines; None when it printed none."""
    try:
        with open(log_path, errors="replace") as fh:
            for line in fh:
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "interruption":
                    deadline = event.get("deadline")
                    return (
                        _seconds(event.get("detected_at")),
                        None if deadline is None else _seconds(deadline),
                    )
    except OSError:
        return None
    return None


def _seconds(value: object) -> float:
    """The watcher's ``detected_at`` (RFC 3339 text or POSIX seconds) as POSIX seconds."""
    from datetime import datetime

    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def report(
    exit_code: int, watch_log: str | None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    notice = first_notice(watch_log) if watch_log else None
    return write_report(
        exit_code=exit_code,
        notice_at=None if notice is None else notice[0],
        reclaim_at=None if notice is None else notice[1],
        ended_at=time.time(),
        environ=environ,
    )


def own_instance(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(instance id, region) of the instance this runs on, from IMDSv2 (bounded
    timeouts; ``SPOT_METADATA_ENDPOINT`` points elsewhere in tests)."""
    from spot_core.interruption.aws import ENDPOINT, AwsDetector

    env = os.environ if environ is None else environ
    imds = AwsDetector(env.get(attempt_env.METADATA_ENDPOINT) or ENDPOINT)
    return (
        imds.metadata("/latest/meta-data/instance-id"),
        imds.metadata("/latest/meta-data/placement/region"),
    )


def tag_own_instance(key: str, value: str, environ: Mapping[str, str] | None = None) -> str:
    """Tag the instance this runs on (``ec2:CreateTags``, which the instance policy allows
    only on the calling instance itself, so no other node can set this tag here); the
    instance id. The call's lease publishes its public key this way (prefect_spot)."""
    from spot_core.adaptors import aws

    instance_id, region = own_instance(environ)
    client = aws.make_client("ec2", region=region, endpoint_url=aws.ec2_endpoint())
    aws.call(
        f"ec2:CreateTags on {instance_id} (its own instance)",
        lambda: client.create_tags(Resources=[instance_id], Tags=[{"Key": key, "Value": value}]),
    )
    return instance_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spot_core.providers.ec2_agent")
    sub = parser.add_subparsers(dest="what", required=True)
    rep = sub.add_parser("report", help="write the attempt's status object to its store")
    rep.add_argument("--exit-code", type=int, required=True)
    rep.add_argument("--watch-log", default=None)
    args = parser.parse_args(argv)
    doc = report(args.exit_code, args.watch_log, os.environ)
    print(json.dumps(doc), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
