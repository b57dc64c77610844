"""Capacity providers by name: the ``spot_pipelines.providers`` entry-point group.

Every provider, the built-in ``local``, ``ec2`` and ``kubernetes`` included, is an entry
in that group naming a ``ProviderPlugin`` (``spot_core.providers.base``) in the
provider's own module::

    [project.entry-points."spot_pipelines.providers"]
    acme = "acme_spot.provider:AcmePlugin"

The names are read once per process without importing anything; a plugin is imported
the first time its name is used. ``open_provider(name, **options)`` builds one from plain,
JSON-able options (a provider's ``options`` attribute reopens it in another process: an
Airflow trigger, a Prefect worker; the engines reach it as ``spot_core.jobs.open_provider``,
the same function), and ``check_provider(name, options, instance_types)``
refuses a bad name or option set before anything opens, so a DAG fails when it is parsed
and a block when it is built, not when capacity is launched.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spot_core import plugins
from spot_core.errors import ConfigError
from spot_core.providers.base import Provider, ProviderPlugin

GROUP = "spot_pipelines.providers"
# What every surface runs on unless told (SpotSettings' default): it needs no cloud
# account. Listed first; the others follow by name.
DEFAULT_PROVIDER = "local"


def _unknown(name: str, names: tuple[str, ...]) -> str:
    return (
        f"provider {name!r} is not installed; choose one of "
        f"{', '.join(_default_first(names)) or _NONE_INSTALLED}"
    )


def _bind(plugin: ProviderPlugin, name: str) -> ProviderPlugin:
    """One plugin per registered name, answering to that name."""
    plugin = copy.copy(plugin)
    plugin.name = name
    return plugin


_PLUGINS: plugins.Registry[ProviderPlugin] = plugins.Registry(
    GROUP, "provider", ProviderPlugin, _unknown, _bind
)


def provider_names() -> tuple[str, ...]:
    """Every installed provider's name: the default first, then this package's, then every
    other package's, each by name (nothing is imported to list them)."""
    return _default_first(_PLUGINS.names())


def _default_first(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(names, key=lambda name: name != DEFAULT_PROVIDER))


def provider_plugin(name: str) -> ProviderPlugin:
    """The plugin registered as ``name`` (imported on first use), its ``name`` that name;
    one-line ConfigError naming the installed ones when there is none."""
    return _PLUGINS.get(name)


_NONE_INSTALLED = (
    "none: no package declares a provider here (install spot-pipelines, "
    "e.g. `pip install -e .` in a checkout, so its entry points exist)"
)
# The refusal of a provider name when nothing is installed at all (the settings say it).
NO_PROVIDER_INSTALLED = (
    "is not installed, and no provider is: install spot-pipelines "
    "(`pip install spot-pipelines`, or `pip install -e .` in a checkout) so that its "
    f"`{GROUP}` entry points exist"
)


def check_provider(
    name: str,
    options: Mapping[str, Any] | None = None,
    instance_types: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> None:
    """One-line ConfigError if ``name`` is not installed, ``options`` do not suit it or
    hold a credential, or ``env`` (the step's environment, when known) is refused by it."""
    plugin = provider_plugin(name)
    options = dict(options or {})
    refuse_credentials(options)
    plugin.check_options(options, tuple(instance_types or ()))
    if env:
        plugin.check_env(env)


def open_provider(name: str = "local", *, session: Any = None, **options: Any) -> Provider:
    """The provider called ``name``, configured by ``options`` (the provider checks them
    as it opens; callers that hold options separately run ``check_provider`` first).

    ``session``: how this process reaches the provider's cloud, resolved by the engine
    adapter from its own place for credentials (an Airflow connection, a Prefect block)
    in each process that opens the provider, never carried in ``options``; what kind the
    provider takes is its plugin's ``session``, and a provider that takes none ignores it.
    """
    plugin = provider_plugin(name)
    return plugin.open(options, session if plugin.session is not None else None)


def refuse_credentials(options: Mapping[str, Any]) -> None:
    """Provider options travel in plain sight (trigger kwargs, job variables, logs), so a
    credential there, by option name or by value at any depth, is one line naming where
    it is (never the value) and the fix."""
    from spot_core.credentials import SECRET_NAME, value_kind

    for name in options:
        if isinstance(name, str) and SECRET_NAME.search(name):
            raise ConfigError(
                f"provider_options[{name!r}] looks like a credential; never put "
                "credentials in provider_options (they are stored and logged "
                "in plain text): use the instance profile, the environment "
                "of the process that opens the provider, or a secrets manager"
            )
    for where, text in _strings(options, "provider_options"):
        kind = value_kind(text)
        if kind:
            raise ConfigError(
                f"{where} holds {kind}; never put credentials in "
                "provider_options (they are stored and logged in plain "
                "text): use the instance profile or a secrets manager"
            )


def _strings(value: Any, where: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(where, text) of every string in a JSON-like value, keys included."""
    if depth > 32:
        return
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key, where, depth + 1)
            yield from _strings(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]", depth + 1)
