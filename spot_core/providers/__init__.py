"""Capacity providers: launch, observe and terminate leases (local, ec2, kubernetes),
registered by name.

Cloud SDKs are imported inside their provider modules, never here, so each is an
optional extra. Each provider is registered once with an opener and an option check:
``open_provider(name, **options)`` builds one from plain, JSON-able options (a
provider's ``options`` attribute reopens it in another process: an Airflow trigger, a
Prefect worker), and ``check_provider(name, options, instance_types)`` refuses a bad
name or option set before anything opens, so a DAG fails when it is parsed and a block
when it is built, not when capacity is launched.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from spot_core.bounds import MAX_TIME_SCALE, MAX_WAIT_SECONDS
from spot_core.errors import ConfigError
from spot_core.model import MAX_PRICE_PER_HOUR
from spot_core.providers.base import Bill, LaunchSpec, LeaseState, LeaseStatus, Provider

OptionCheck = Callable[[Mapping[str, Any], Sequence[str]], None]


@dataclass(frozen=True)
class ProviderEntry:
    """How to open one provider by name, and how to check its options without opening it."""

    name: str
    open: Callable[..., Provider]
    check_options: OptionCheck
    # What the provider refuses in the step's environment (ec2: credentials, which would
    # land in user-data); None: any environment.
    check_env: Callable[[Mapping[str, str]], None] | None = None
    # The opener takes ``session=``: how this process reaches the provider's cloud (ec2: a
    # boto3 Session or AwsAccess), resolved from the engine's connection or block.
    takes_session: bool = False


_REGISTRY: dict[str, ProviderEntry] = {}


def register_provider(name: str, opener: Callable[..., Provider], check: OptionCheck,
                      check_env: Callable[[Mapping[str, str]], None] | None = None, *,
                      takes_session: bool = False) -> None:
    """Make ``name`` a provider every surface (CLI, operator, block, worker) accepts;
    ``takes_session``: its opener accepts ``session=`` (see ``open_provider``)."""
    _REGISTRY[name] = ProviderEntry(name, opener, check, check_env, takes_session)


def takes_session(name: str) -> bool:
    """Whether provider ``name``'s opener accepts ``session=`` (see ``open_provider``)."""
    return _entry(name).takes_session


def provider_names() -> tuple[str, ...]:
    """The providers that are built, in registration order."""
    return tuple(_REGISTRY)


def _entry(name: str) -> ProviderEntry:
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"provider {name!r} is not built; choose one of "
                          f"{', '.join(_REGISTRY)}")
    return entry


def check_provider(name: str, options: Mapping[str, Any] | None = None,
                   instance_types: Sequence[str] = (),
                   env: Mapping[str, str] | None = None) -> None:
    """One-line ConfigError if ``name`` is not built, ``options`` do not suit it or hold a
    credential, or ``env`` (the step's environment, when known) is refused by it."""
    entry = _entry(name)
    options = dict(options or {})
    refuse_credentials(options)
    entry.check_options(options, tuple(instance_types or ()))
    if env and entry.check_env is not None:
        entry.check_env(env)


def refuse_credentials(options: Mapping[str, Any]) -> None:
    """Provider options travel in plain sight (trigger kwargs, job variables, logs), so a
    credential there, by option name or by value at any depth, is one line naming where
    it is (never the value) and the fix."""
    from spot_core.credentials import SECRET_NAME, value_kind

    for name in options:
        if isinstance(name, str) and SECRET_NAME.search(name):
            raise ConfigError(f"provider_options[{name!r}] looks like a credential; never put "
                              "credentials in provider_options (they are stored and logged "
                              "in plain text): use the instance profile, the environment "
                              "of the process that opens the provider, or a secrets manager")
    for where, text in _strings(options, "provider_options"):
        kind = value_kind(text)
        if kind:
            raise ConfigError(f"{where} holds {kind}; never put credentials in "
                              "provider_options (they are stored and logged in plain "
                              "text): use the instance profile or a secrets manager")


def _strings(value: Any, where: str, depth: int = 0):
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


def open_provider(name: str = "local", *, session: Any = None, **options: Any) -> Provider:
    """The provider called ``name``, configured by ``options`` (the provider checks them
    as it opens; callers that hold options separately run ``check_provider`` first).

    ``session``: how this process reaches the provider's cloud, resolved by the engine
    adapter from its own place for credentials (an Airflow connection, a Prefect block)
    in each process that opens the provider, never carried in ``options`` (for ec2 a
    boto3 ``Session`` or ``spot_core.adaptors.aws.AwsAccess``; None: the SDK's default
    chain). A provider that reaches no cloud (local) ignores it.
    """
    entry = _entry(name)
    if session is not None and entry.takes_session:
        return entry.open(session=session, **options)
    return entry.open(**options)


# -- local: the trace-driven local spot cloud --------------------------------------------------
def _open_local(**options: Any) -> Provider:
    from spot_core.providers.local import LocalProvider

    return LocalProvider.from_options(**options)


def _check_local(options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
    """Option names must be ``LocalProvider.from_options`` parameters."""
    from spot_core.providers.local import LocalProvider

    known = set(inspect.signature(LocalProvider.from_options).parameters) - {"cls"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown local provider option(s) {unknown}; choose from "
                          f"{sorted(known)}")
    for name, value in options.items():
        _check_local_value(name, value)


def _check_local_value(name: str, value: Any) -> None:
    """Each local option's type and range, so a bad one fails where it is written. A
    value still holding a template (``{{ ... }}``, Airflow's and Prefect's) is checked by
    the opener once rendered."""
    if value is None or (isinstance(value, str) and "{{" in value):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "time_scale" and not (number and math.isfinite(value)
                                     and 0 < value <= MAX_TIME_SCALE):
        raise ConfigError(f"local provider option time_scale={value!r} must be a finite "
                          f"number > 0 and at most {MAX_TIME_SCALE:,.0f} (trace seconds per "
                          "wall second, e.g. 3600; the traces' tick may lower the bound)")
    if name == "watch_poll_interval" and not (number and math.isfinite(value)
                                              and 0 < value <= MAX_WAIT_SECONDS):
        raise ConfigError(f"local provider option watch_poll_interval={value!r} must be a "
                          "finite number of seconds > 0 and at most 86400 (how often each "
                          "lease's watcher polls its metadata endpoint, e.g. 1)")
    if name == "start_tick" and not (number and isinstance(value, int) and value >= 0):
        raise ConfigError(f"local provider option start_tick={value!r} must be a whole "
                          "number >= 0 (a row of the traces)")
    if name == "on_demand_price" and not (number and math.isfinite(value)
                                          and 0 < value <= MAX_PRICE_PER_HOUR):
        raise ConfigError(f"local provider option on_demand_price={value!r} must be a finite "
                          f"$/h > 0 and at most {MAX_PRICE_PER_HOUR:,.0f} (the traces' "
                          "on-demand price, e.g. 3.06)")
    if name in ("url", "prices", "workdir") and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"local provider option {name}={value!r} must be a non-empty string")
    if name == "url" and not value.startswith(("http://", "https://")):
        raise ConfigError(f"local provider option url={value!r} must be the server's "
                          "http:// URL, e.g. http://127.0.0.1:8765")
    if name == "traces" and (isinstance(value, str) or not isinstance(value, (list, tuple))
                             or not all(isinstance(t, str) and t.strip() for t in value)):
        raise ConfigError(f"local provider option traces={value!r} must be a list of trace "
                          "file paths")


# -- ec2 -------------------------------------------------------------------------------------------
EC2_REQUIRED = ("subnets", "image_id")


def _open_ec2(**options: Any) -> Provider:
    try:
        from spot_core.providers.ec2 import Ec2Provider
    except ImportError as exc:
        raise ConfigError(f"the ec2 provider needs boto3: install spot-pipelines[aws] "
                          f"({exc})") from exc
    return Ec2Provider.from_options(**options)


def _check_ec2(options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
    """Every name an ec2 option; ``subnets``, ``image_id`` and ``instance_types`` (in the
    options or the configuration's own list) present; a ``bootstrap`` well formed. The region may come from the
    environment of the process that opens the provider, so it is not required here."""
    from spot_core.providers.ec2 import check_option_names

    from spot_core.providers.ec2_bootstrap import Bootstrap

    check_option_names(options)
    Bootstrap.from_plain(options.get("bootstrap"))
    missing = [name for name in EC2_REQUIRED if not options.get(name)]
    if not options.get("instance_types") and not instance_types:
        missing.append("instance_types")
    if missing:
        raise ConfigError(f"provider 'ec2' needs provider_options {missing}, e.g. "
                          "{'region': 'us-east-1', 'subnets': ['subnet-...'], 'image_id': "
                          "'ami-...', 'instance_types': ['g5.xlarge'], 'instance_profile': "
                          "'spot-step'} (see docs/aws.md)")


def _check_ec2_env(env: Mapping[str, str]) -> None:
    from spot_core.providers.ec2 import refuse_credentials_in_env

    refuse_credentials_in_env(env)


# -- kubernetes -------------------------------------------------------------------------------
def _open_kubernetes(session: Any = None, **options: Any) -> Provider:
    """``session``: a ``kubernetes.client.ApiClient`` the caller resolved (an Airflow
    ``kubernetes_conn_id`` through cncf-kubernetes' hook); anything else (None, or the AWS
    access a Prefect worker holds for its stores): the kubeconfig options."""
    from spot_core.adaptors import kubernetes as k8s
    from spot_core.providers.kubernetes import KubernetesOptions, KubernetesProvider

    if not isinstance(session, k8s.kubernetes().client.ApiClient):
        return KubernetesProvider.from_options(**options)
    return KubernetesProvider(KubernetesOptions.from_plain(**options), api=k8s.core_api(session))


def _check_kubernetes(options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
    """Every name a kubernetes option, each value of its type (no API call). Pools come
    from the cluster's node labels, so ``instance_types`` is not needed."""
    from spot_core.providers.kubernetes import check_option_names, check_option_value

    check_option_names(options)
    for name, value in options.items():
        check_option_value(name, value)


register_provider("local", _open_local, _check_local)
register_provider("ec2", _open_ec2, _check_ec2, _check_ec2_env, takes_session=True)
register_provider("kubernetes", _open_kubernetes, _check_kubernetes, takes_session=True)

# Kept for callers that list the names; the registry is the source.
PROVIDER_NAMES = provider_names()

__all__ = ["Bill", "LaunchSpec", "LeaseState", "LeaseStatus", "Provider", "PROVIDER_NAMES",
           "ProviderEntry", "check_provider", "open_provider", "provider_names",
           "refuse_credentials", "register_provider", "takes_session"]
