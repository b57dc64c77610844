"""Shared fixtures for tests/core."""

import pytest

from tests.support.aws_helpers import aws_env, moto_server  # noqa: F401  (pytest fixtures)
from tests.support.dist_helpers import CleanInstalls, build_dist
from tests.support.kube_helpers import kube_client, kube_cluster, kube_namespace  # noqa: F401,E402


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory):
    """(sdist, wheel) of this repository, built once per session with `uv build`."""
    return build_dist(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def clean_installs(built_dist, tmp_path_factory) -> CleanInstalls:
    """The built wheel in a clean environment per extra, each built once per session."""
    return CleanInstalls(tmp_path_factory.mktemp("clean-installs"), built_dist[1])
