"""Prefect blocks -> what spot_core takes to reach AWS, resolved where the work runs.

Prefect users keep AWS credentials in a prefect-aws ``AwsCredentials`` block; spot_core
takes a session object and never reads credentials from its options. A
``SpotConfiguration``, a ``CheckpointStorage`` and the spot worker's job variables hold
the block (a saved one by reference), and the process that opens the provider or the
store (the flow run's task runner, the worker) turns it into a
``spot_core.adaptors.aws.AwsAccess`` here: the block's ``get_boto3_session()`` (keys, a
profile, or the profile's role), its region and its client parameters' endpoint.
"""

from __future__ import annotations

import hashlib
from typing import Any

from spot_core.adaptors.aws import AwsAccess


def aws_access(credentials: Any) -> AwsAccess | None:
    """The ``AwsAccess`` of an ``AwsCredentials`` block; None (boto3's default chain)
    without one."""
    if credentials is None:
        return None
    params = credentials.aws_client_parameters
    verify = params.verify
    return AwsAccess(session=credentials.get_boto3_session(), region=credentials.region_name,
                     endpoint_url=params.endpoint_url,
                     verify=None if verify is None else (verify if isinstance(verify, bool)
                                                          else str(verify)))


def fingerprint(credentials: Any) -> str:
    """An in-memory key telling two blocks apart (providers are cached per credentials);
    a digest, so the key itself holds no secret."""
    if credentials is None:
        return ""
    dumped = credentials.model_dump_json(context={"include_secrets": True})
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]
