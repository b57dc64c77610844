"""The provider protocol: the only way the controller touches capacity; and what a
provider declares about itself (``ProviderPlugin``).

A provider turns a ranked pool and a launch spec into a ``Lease``, reports what became
of its leases (batched, so a cloud provider can answer many leases with one describe
call), bills them, and terminates them. Launch failures for lack of capacity raise
``CapacityUnavailable``; everything else is translated at the edge into a ``SpotError``
whose message says what to fix.

A ``ProviderPlugin``, written in the provider's own module and named by an entry point
(``spot_pipelines.providers``), says everything the engines would otherwise hard-code:
its ``Capability`` flags, which kind of session it takes, its options' defaults and
checks, which checkpoint stores its leases reach, the environment and Python a lease
gets, its console link and its own ``spot-pipelines run`` flags. Nothing outside a
provider's module branches on its name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from enum import Flag, StrEnum, auto
from typing import Any, Protocol

from spot_core.model import Lease, Pool


@dataclass(frozen=True)
class LaunchSpec:
    """What to run for one attempt, and what it needs to know about itself.

    ``image``: run ``command`` in this container image (Docker on the machine that runs
    the step; see ``spot_core.container``) instead of directly on the machine.
    ``heartbeat_timeout_seconds``: the provider passes it to the node's watcher
    (``SPOT_HEARTBEAT_TIMEOUT``), which ends the lease once the driver stops renewing.
    """

    job_id: str
    attempt: int
    command: tuple[str, ...]
    checkpoint_uri: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    image: str | None = None
    # Seconds the step may outlive a silent driver: the node's watcher ends the lease when
    # the job's heartbeat (``spot_core.checkpoint.heartbeat``) is older. None: never.
    heartbeat_timeout_seconds: float | None = None


class Capability(Flag):
    """What a provider can do, declared (SkyPilot's feature sets): the controller and the
    engines ask these flags, never ``hasattr`` and never a provider's name."""

    NONE = 0
    # Spot pools, each with its on-demand counterpart to fall back to.
    SPOT = auto()
    # Its leases run on this machine: they reach a file:// store, run this Python with
    # this process's imports, and may get its environment as it is.
    ON_THIS_MACHINE = auto()
    # ``open_store(uri)``: the jobs' stores, reached with the provider's own credentials.
    OWN_STORES = auto()
    # ``launch_any(spec, pools)``: one request for any of several pools of a region.
    LAUNCH_ANY = auto()
    # ``instance_tag(region, lease_id, key)``, and ``ProviderPlugin.publish_from_lease``:
    # a lease publishes a value on its own capacity that only it can set (the call
    # exchange's public key, prefect_spot._remote).
    LEASE_TAGS = auto()
    # ``cleanup_orphans(job_id)``: end every lease of a job no live driver owns.
    CLEANUP_ORPHANS = auto()
    # ``LaunchSpec.image``: the command runs in a container image.
    IMAGES = auto()
    # The command always runs in an image: it need not exist on this machine.
    COMMAND_IN_IMAGE = auto()
    # Its market replays traces on a tick clock (capacity time runs faster than the wall
    # clock): deadline policies plan on it, and a driver can say where in the trace it is.
    TRACE_CLOCK = auto()
    # A job may hold two leases at once: a reclaimed attempt's replacement is launched on
    # the notice while the old one saves (the ``handover`` setting's default is then
    # ``on_notice``; ``off`` elsewhere).
    PARALLEL_LAUNCH = auto()


class SessionKind(StrEnum):
    """Which credentials an engine resolves for a provider, in each process that opens it
    (an Airflow connection, a Prefect block): never carried in its options."""

    AWS = "aws"  # an AwsAccess or boto3 Session (aws_conn_id, AwsCredentials)
    KUBERNETES = (
        "kubernetes"  # a kubernetes ApiClient (kubernetes_conn_id, KubernetesClusterConfig)
    )


class LeaseState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"  # the step's process ended by itself (any exit code)
    RECLAIMED = "reclaimed"  # the capacity was taken away after its notice period
    TERMINATED = "terminated"  # we terminated it


@dataclass(frozen=True)
class LeaseStatus:
    """What a provider observed of one lease at one moment. Only ``state`` is positional:
    four optional numbers in a row (exit code, three times) are too easy to swap."""

    state: LeaseState
    _: KW_ONLY
    exit_code: int | None = None
    notice_at: float | None = None  # when an interruption notice was first served, if ever
    ended_at: float | None = None
    message: str = ""
    # A provider that reads why its lease ended better than an exit code can says so here
    # (an ``Outcome`` value): the kubernetes provider's pod classifier, which decides a
    # disruption before the exit code (a step that exits 0 on the kubelet's SIGTERM was cut
    # short, not done). None: the controller classifies from the state and exit code.
    outcome: str | None = None
    # When a rebalance recommendation (an elevated risk of interruption, before any notice)
    # was first seen, where the provider reports one; ``handover=on_rebalance`` starts on it.
    rebalance_at: float | None = None
    # When the capacity will be taken, where the notice says (AWS: two minutes after it);
    # a replacement waits for the old attempt at most until then.
    reclaim_at: float | None = None

    @property
    def ended(self) -> bool:
        return self.state is not LeaseState.RUNNING


@dataclass(frozen=True)
class Observation:
    """One lease as a describe made elsewhere saw it (``spot_core.observer``, which batches
    many leases into one call): its ``status`` (None: the provider did not report the
    lease) or the ``error`` that describe raised, and ``at``, when the describe began.
    The controller reads it as if it had observed the lease itself."""

    lease_id: str
    status: LeaseStatus | None = None
    error: BaseException | None = None
    at: float = 0.0

    def result(self) -> LeaseStatus | None:
        """The status, or the describe's error raised here, for the one who reads it."""
        if self.error is not None:
            raise self.error
        return self.status


@dataclass(frozen=True)
class Bill:
    """Cost of a lease over its life, and what on-demand would have cost for the same time.

    ``capacity_seconds`` is the lease's duration in the provider's clock (the local spot
    cloud replays traces faster than real time; a cloud provider's scale is 1).
    ``data_transfer_cost`` is the part of ``cost`` paid to move data to the lease (a
    checkpoint read from another region), shown on its own in the ledger.
    """

    cost: float
    on_demand_cost: float
    capacity_seconds: float
    data_transfer_cost: float = 0.0


class Provider(Protocol):
    """``market`` answers offers for the provider's pools (a trace market, the EC2 market);
    ``options`` are JSON-able, hold no credential, and reopen the provider elsewhere via
    ``open_provider`` (with that process's own ``session``, resolved from the engine's
    connection or block). ``capabilities`` says which optional methods it has: with
    ``OWN_STORES``, ``open_store(uri)``, which the controller then uses for its jobs'
    checkpoint stores (the provider's credentials); see ``Capability``."""

    name: str
    capabilities: Capability
    market: Any

    @property
    def options(self) -> Mapping[str, Any]:
        """Read-only here, so a provider may keep them in a dict of its own."""

    def pools(self) -> tuple[Pool, ...]:
        """The spot pools this provider can launch in, ranked by nothing in particular."""

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        """Start the attempt on ``pool``; raise ``CapacityUnavailable`` if it has none."""

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        """Status per lease id, for many leases at once."""

    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """What the lease cost from its start to ``ended_at`` (wall-clock POSIX seconds)."""

    def capacity_seconds(self, wall_seconds: float) -> float:
        """Convert a wall-clock duration into the provider's capacity time."""

    def terminate(self, lease: Lease) -> None:
        """Release the lease; idempotent; never raises for an already-gone lease."""

    def close(self) -> None:
        """Terminate every lease this provider launched and release its resources."""


class ProviderPlugin:
    """What a provider declares about itself: subclass it in the provider's module and
    name the class in the ``spot_pipelines.providers`` entry-point group. The registry
    makes one instance per registered name and sets ``name`` to that name, so a package
    may register a built-in provider's plugin under a new name.

    The defaults are those of a provider that needs nothing: no session, options taken
    as given, any store reachable (``ON_THIS_MACHINE``) or none but s3://.
    """

    name: str = ""
    capabilities: Capability = Capability.NONE
    session: SessionKind | None = None
    summary: str = ""
    # What its leases are called, and the store they reach, for a one-line refusal.
    lease_noun: str = "leases"
    store_hint: str = "'s3://bucket/prefix'"
    # A provider whose leases are pods: the container that runs the step (whose log an
    # engine streams, as KubernetesPodOperator's ``get_logs`` does).
    step_container: str | None = None

    def open(self, options: Mapping[str, Any], session: Any = None) -> Provider:
        """The provider from plain, JSON-able ``options`` (checked as it opens) and this
        process's ``session`` (see ``session``; None: the SDK's default chain)."""
        raise NotImplementedError

    def check_options(self, options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
        """One-line ConfigError for a bad option, without any cloud call (a DAG fails when
        it is parsed, a block when it is built). A value holding a template (``{{``) is
        checked once rendered."""

    def check_env(self, env: Mapping[str, str]) -> None:
        """One-line ConfigError for what it refuses in the step's environment."""

    def option_defaults(
        self,
        options: Mapping[str, Any],
        *,
        instance_types: Sequence[str] = (),
        session: Any = None,
        scratch_dir: str | None = None,
    ) -> dict[str, Any]:
        """``options`` with what the provider fills in when they are silent: the settings'
        ``instance_types``, what the ``session`` says (its region), an engine's
        ``scratch_dir`` for files of its own."""
        return dict(options)

    def reaches_store(self, uri: str | None, options: Mapping[str, Any]) -> bool:
        """Whether its leases can reach the checkpoint store ``uri`` (None: a folder on
        this machine)."""
        if Capability.ON_THIS_MACHINE in self.capabilities:
            return True
        return bool(uri) and str(uri).startswith("s3://")

    def store_problem(
        self, uri: str | None, options: Mapping[str, Any], *, what: str
    ) -> str | None:
        """Why ``uri`` (the surface calls it ``what``) cannot be its leases' store, in one
        line naming the fix; None when it can."""
        if self.reaches_store(uri, options):
            return None
        shown = "none (a folder on this machine)" if uri is None else repr(uri)
        return (
            f"provider {self.name!r} needs {what} {self.store_hint}: its {self.lease_noun} "
            f"cannot see this machine's disk (got {shown})"
        )

    def lease_environment(self, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """``env`` as it may go to a lease, and the names dropped from it: off this machine,
        names that look like credentials (a lease gets its access from its own role; the
        EC2 provider writes the environment into user-data)."""
        if Capability.ON_THIS_MACHINE in self.capabilities:
            return dict(env), []
        from spot_core.credentials import secret_names

        dropped = secret_names(env)
        return {k: v for k, v in env.items() if k not in dropped}, dropped

    def lease_python(self, options: Mapping[str, Any]) -> str:
        """The Python that runs a step on its leases."""
        if Capability.ON_THIS_MACHINE in self.capabilities:
            return sys.executable
        return "python3"

    def console_link(self, lease: Lease) -> str | None:
        """The web console page of the capacity ``lease`` runs on, if the cloud has one."""
        return None

    def publish_from_lease(self, key: str, value: str, environ: Mapping[str, str]) -> bool:
        """On a lease (``LEASE_TAGS``): set ``key`` to ``value`` on the lease's own capacity
        when ``environ`` is one of this provider's leases; False when it is not."""
        return False

    # -- `spot-pipelines run` --------------------------------------------------------------
    def add_cli_arguments(self, parser: Any) -> None:
        """Flags of its own for ``spot-pipelines run`` (an argument group named after it)."""

    def cli_options(self, args: Any) -> dict[str, Any]:
        """Its options from those flags (checked; one line naming the flag)."""
        return {}

    def open_for_cli(self, args: Any, options: Mapping[str, Any]) -> Provider:
        """``spot-pipelines run``'s provider from ``options`` (``cli_options``'s)."""
        return self.open(options, None)

    def pool_aliases(self, provider: Provider) -> dict[str, Pool]:
        """Other names a user may give ``--pools`` for some pools (beside zone and key)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What ``spot-pipelines providers`` shows of it (JSON-able)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "capabilities": [
                c.name.lower() for c in Capability if c and c in self.capabilities and c.name
            ],
            "session": None if self.session is None else str(self.session),
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
        }


def key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """Repeated ``KEY=JSON`` flags as options (a value that is not JSON is a bare string):
    how a plugin's ``--...-option`` flags reach its options."""
    from spot_core.errors import ConfigError

    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value  # a bare string
    return options
