"""Shared fixtures for tests/core."""

from aws_helpers import aws_env, moto_server  # noqa: F401  (pytest fixtures)
