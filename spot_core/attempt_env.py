"""Environment variables through which a launched step learns about its attempt.

A provider sets these on the step's process; the step's Checkpointer and the
interruption watcher read them. Nothing the next attempt needs lives on the node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

CHECKPOINT_URI = "SPOT_CHECKPOINT_URI"
JOB_ID = "SPOT_JOB_ID"
ATTEMPT = "SPOT_ATTEMPT"
METADATA_ENDPOINT = "SPOT_METADATA_ENDPOINT"
CLOUD = "SPOT_CLOUD"
NOTICE_FILE = "SPOT_NOTICE_FILE"


@dataclass(frozen=True)
class AttemptEnv:
    checkpoint_uri: str | None
    job_id: str | None
    attempt: int
    metadata_endpoint: str | None
    cloud: str | None
    notice_file: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AttemptEnv:
        env = os.environ if environ is None else environ
        return cls(
            checkpoint_uri=env.get(CHECKPOINT_URI) or None,
            job_id=env.get(JOB_ID) or None,
            attempt=int(env.get(ATTEMPT) or 1),
            metadata_endpoint=env.get(METADATA_ENDPOINT) or None,
            cloud=env.get(CLOUD) or None,
            notice_file=env.get(NOTICE_FILE) or None,
        )

    def to_environ(self) -> dict[str, str]:
        pairs = {CHECKPOINT_URI: self.checkpoint_uri, JOB_ID: self.job_id,
                 ATTEMPT: str(self.attempt), METADATA_ENDPOINT: self.metadata_endpoint,
                 CLOUD: self.cloud, NOTICE_FILE: self.notice_file}
        return {k: v for k, v in pairs.items() if v is not None}

# A step that saved its emergency checkpoint and stopped on a notice exits like a process
# ended by SIGTERM (128 + 15), which is what a shell or an engine would report anyway.
PREEMPTED_EXIT_CODE = 143
