"""Shared fixtures for tests/core."""

from aws_helpers import aws_env, moto_server  # noqa: F401  (pytest fixtures)
from kube_helpers import kube_client, kube_cluster, kube_namespace  # noqa: F401,E402
