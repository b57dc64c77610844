"""Subcommands of `spot-pipelines`; each module has ``register(subparsers)``."""
