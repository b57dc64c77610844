"""The AWS edge: lazy boto3, client construction, error translation, bounded backoff.

Like SkyPilot's ``adaptors/aws.py``: nothing else in ``spot_core`` imports boto3, so the
core installs without it, and every AWS error crosses into spot-pipelines here, as a
``SpotError`` whose class says what the controller should do (``CapacityUnavailable``
moves on to the next pool; ``InfrastructureError`` is retryable; ``ConfigError`` is not)
and whose message says what to fix. Clients use botocore's bounded ``standard`` retry
mode (transient 5xx, connection errors, throttling); throttling that outlives it
(``RequestLimitExceeded`` and friends) gets a few more jittered rounds, also bounded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Generic, TypeVar

from spot_core.adaptors import extras
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError, SpotError

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

S3_ENDPOINT_ENV = "SPOT_S3_ENDPOINT_URL"
EC2_ENDPOINT_ENV = "SPOT_EC2_ENDPOINT_URL"

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "Unsupported",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
    }
)
THROTTLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "SlowDown",
        "RequestThrottled",
        "TooManyRequestsException",
    }
)
CONFIG_CODES = {
    "UnauthorizedOperation": "the controller's IAM role lacks this action; attach the policy "
    "in docs/aws-iam-policy.json",
    "AccessDenied": "the IAM role lacks this action; attach the policy in docs/aws-iam-policy.json",
    "AuthFailure": "AWS rejected the credentials; check the controller's role or profile",
    "InvalidAMIID.NotFound": "the image id does not exist in this region; pass image_id "
    "of an AMI in the pool's region",
    "InvalidAMIID.Malformed": "the image id is malformed; pass an id like ami-0123456789abcdef0",
    "InvalidSubnetID.NotFound": "a subnet does not exist; check the subnets option",
    "InvalidParameterValue": "a launch parameter was rejected; check instance type, image "
    "and subnet for this region",
    "InvalidParameterCombination": "these launch parameters cannot be combined; check "
    "the instance type against the image",
    "NoSuchBucket": "the checkpoint bucket does not exist; create it or fix the s3:// URI",
}


def boto3() -> ModuleType:
    """Import boto3 on first use, with a message that names the extra."""
    return extras.require("boto3")


def client_error_class() -> type[Exception]:
    from botocore.exceptions import ClientError

    error_class: type[Exception] = ClientError  # botocore is untyped here
    return error_class


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


RETRY_ATTEMPTS = 5  # botocore "standard" mode: 4 retries, jittered backoff capped at 20 s
CONNECT_TIMEOUT_SECONDS = 10.0  # per connection attempt
READ_TIMEOUT_SECONDS = 60.0  # per socket read: silence this long ends one attempt


@dataclass(frozen=True)
class AwsAccess:
    """How this process reaches AWS: where its clients get credentials and endpoints.

    Built by an engine adapter from the engine's own place for credentials (an Airflow
    connection through the amazon provider's hook, a Prefect ``AwsCredentials`` block)
    and handed to the provider and the stores as an object, never as options: it holds a
    boto3 ``Session`` (keys, a profile, or a role the session assumes and refreshes), so
    it is never serialised and its repr shows no credential. The default, ``AwsAccess()``,
    is boto3's own chain (environment, profile, instance role).

    ``region``: the region of clients asked for none. ``endpoint_url``: the endpoint of
    every service (an emulator, a VPC endpoint); ``service_endpoints`` per service
    (``{"s3": ...}``) win over it; an endpoint the caller names wins over both.
    """

    session: Any = field(default=None, repr=False)
    region: str | None = None
    endpoint_url: str | None = None
    service_endpoints: Mapping[str, str] = field(default_factory=dict)
    verify: bool | str | None = None

    def endpoint(self, service: str, explicit: str | None = None) -> str | None:
        """The endpoint for ``service``: the caller's, this access's for the service, or
        this access's for every service (None: boto3 decides)."""
        return explicit or self.service_endpoints.get(service) or self.endpoint_url or None

    def client(
        self,
        service: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        config: Any = None,
    ) -> Any:
        session = self.session if self.session is not None else boto3().session.Session()
        extra = {} if self.verify is None else {"verify": self.verify}
        return session.client(
            service,
            region_name=region or self.region,
            endpoint_url=self.endpoint(service, endpoint_url),
            config=config,
            **extra,
        )


Access = Any  # an AwsAccess, a boto3 Session, or None (boto3's default chain)


def access_of(value: Access) -> AwsAccess:
    """An ``AwsAccess`` from what a caller injected: one already, a boto3 ``Session``
    (its region becomes the default), or None for boto3's default chain."""
    if value is None:
        return AwsAccess()
    if isinstance(value, AwsAccess):
        return value
    if not callable(getattr(value, "client", None)):
        raise ConfigError(
            f"session={type(value).__name__} is not a boto3 Session or an "
            "AwsAccess; pass boto3.Session(...) or leave it out for boto3's "
            "default credentials"
        )
    return AwsAccess(session=value, region=getattr(value, "region_name", None))


def make_client(
    service: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    session: Access = None,
    max_pool_connections: int = 10,
    retry_attempts: int = RETRY_ATTEMPTS,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
    **extra: Any,
) -> Any:
    """A boto3 client with botocore's bounded ``standard`` retries: transient errors (5xx,
    reset or refused connections, timeouts) and throttling are retried with backoff
    before anything reaches the controller, which then tolerates the rest for its
    ``observe_failure_timeout``. ``session``: where credentials come from (see
    ``AwsAccess``; None: boto3's default chain). Inside a ``within`` block no retry starts
    past the block's deadline."""
    config = extras.require("botocore.config").Config(
        retries={"max_attempts": retry_attempts, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout_seconds,
        read_timeout=read_timeout_seconds,
        **extra,
    )
    return honour_deadlines(
        access_of(session).client(service, region=region, endpoint_url=endpoint_url, config=config)
    )


def honour_deadlines(client: Any) -> Any:
    """``client`` (any boto3 client, also one a caller made), retrying nothing past the
    deadline of a ``within`` block; registered once however often this is called."""
    client.meta.events.register_first(
        "needs-retry", _no_retry_past_deadline, unique_id="spot-pipelines-deadline"
    )
    return client


class DeadlinePassed(Exception):
    """An AWS call failed after the deadline of the ``within`` block around it, so it was
    not retried again (``seconds``: that deadline)."""

    def __init__(self, seconds: float, cause: str) -> None:
        super().__init__(f"no answer within {seconds:g}s ({cause})")
        self.seconds = seconds


_deadline = threading.local()  # (monotonic time, seconds) of this thread's innermost block


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Calls made on this thread inside the block start no retry once ``seconds`` have
    passed (an outer block's earlier deadline wins). Why: botocore's own bound is per
    attempt (connect and read timeouts) times its attempts, minutes for a store that
    stopped answering; a caller such as ``load()`` or ``fence()`` needs one bound."""
    outer = getattr(_deadline, "value", None)
    mine = (time.monotonic() + seconds, seconds)
    _deadline.value = mine if outer is None or mine[0] < outer[0] else outer
    try:
        yield
    finally:
        _deadline.value = outer


def past_deadline() -> float | None:
    """The deadline's seconds if this thread's ``within`` deadline has passed, else None."""
    value = getattr(_deadline, "value", None)
    return value[1] if value is not None and time.monotonic() >= value[0] else None


def _no_retry_past_deadline(
    caught_exception: BaseException | None = None, response: Any = None, **_: Any
) -> None:
    """botocore's ``needs-retry`` hook: a failed attempt past the deadline ends the call."""
    seconds = past_deadline()
    if seconds is None:
        return
    status = getattr(response[0], "status_code", None) if response else None
    if caught_exception is not None:
        raise DeadlinePassed(seconds, f"{type(caught_exception).__name__}: {caught_exception}")
    if status is not None and (status >= 500 or status == 429):
        raise DeadlinePassed(seconds, f"HTTP {status}")


class Kept(Generic[K, V]):
    """A small map kept for the process's life: built on a miss, least recently used
    dropped beyond ``size``, safe from any thread (a build runs under the lock, so two
    threads never build the same value twice)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, build: Callable[[], V]) -> V:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            value = self._values[key] = build()
            while len(self._values) > self.size:
                self._values.popitem(last=False)
            return value


_clients: Kept[tuple[Any, ...], tuple[Any, Any]] = Kept(32)
"""Shared clients: a handful of credential sources, regions and endpoints in practice; the
bound only caps what a caller that makes a new boto3 Session per call could pile up."""
_accesses: Kept[tuple[str, str], AwsAccess] = Kept(16)


def shared_client(
    service: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    session: Access = None,
    max_pool_connections: int = 10,
    retry_attempts: int = RETRY_ATTEMPTS,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> Any:
    """``make_client``'s client, made once per process for the same credentials, region,
    endpoint and settings, and shared (boto3 clients are thread-safe).

    Why: a triggerer or worker watching 1,000 jobs opens 1,000 checkpoint stores. A client
    of its own per store cost about 0.19 s of CPU and 35,000 Python objects (about 12 MiB)
    with boto3's default chain (a fresh boto3 Session loads the service models again), so
    1,000 stores took minutes and gigabytes and made every full garbage collection slow.

    Credentials: an injected session is shared as that session (its refreshable
    credentials refresh in the client); boto3's default chain is keyed by the process's
    ``AWS_*`` environment, so keys rotated there get a new client, not a stale one.
    """
    access = access_of(session)
    # The pid: a forked child must not share its parent's pooled connections.
    key = (
        os.getpid(),
        _credential_source(access),
        service,
        region or access.region,
        access.endpoint(service, endpoint_url),
        access.verify,
        max_pool_connections,
        retry_attempts,
        connect_timeout_seconds,
        read_timeout_seconds,
    )

    def build() -> tuple[Any, Any]:  # the session pinned with its client: its id stays unique
        return access.session, make_client(
            service,
            region=region,
            endpoint_url=endpoint_url,
            session=access,
            max_pool_connections=max_pool_connections,
            retry_attempts=retry_attempts,
            connect_timeout_seconds=connect_timeout_seconds,
            read_timeout_seconds=read_timeout_seconds,
        )

    return _clients.get(key, build)[1]


def kept_access(source: str, fields: Any, build: Callable[[], AwsAccess]) -> AwsAccess:
    """One ``AwsAccess`` per process for an engine's credentials (an Airflow connection, a
    Prefect block), rebuilt when what they say changes: ``fields`` (secrets included) are
    kept only as a SHA-256. So every trigger or flow run, and every store opened with it,
    shares one boto3 session and its clients (``shared_client``); rotated keys get a new
    one."""
    digest = hashlib.sha256(repr(fields).encode()).hexdigest()
    return _accesses.get((source, digest), build)


def _credential_source(access: AwsAccess) -> tuple[str, Any]:
    """What a client's credentials come from: the injected session (by identity), or
    boto3's chain as this process's ``AWS_*`` environment now (hashed: no secret kept)."""
    if access.session is not None:
        return ("session", id(access.session))
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    return ("chain", hashlib.sha256(repr(environment).encode()).hexdigest())


def s3_endpoint(explicit: str | None = None) -> str | None:
    """Explicit wins, then SPOT_S3_ENDPOINT_URL, then boto3's own AWS_ENDPOINT_URL_S3."""
    return explicit or os.environ.get(S3_ENDPOINT_ENV) or None


def ec2_endpoint(explicit: str | None = None) -> str | None:
    """Explicit wins, then SPOT_EC2_ENDPOINT_URL, then boto3's own AWS_ENDPOINT_URL_EC2."""
    return explicit or os.environ.get(EC2_ENDPOINT_ENV) or None


def translate(exc: BaseException, action: str) -> SpotError:
    """One AWS error -> the SpotError that says what it means and what to do."""
    code = error_code(exc)
    message = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
    if code in CAPACITY_CODES:
        return CapacityUnavailable(f"{action}: {code} ({message}); trying the next pool")
    if code in THROTTLE_CODES:
        return InfrastructureError(
            f"{action}: AWS kept throttling ({code}) after bounded "
            "backoff; lower the poll rate or raise the account's API "
            "limits",
            retryable=True,
        )
    hint = CONFIG_CODES.get(code)
    if hint is not None:
        return ConfigError(f"{action}: {code} ({message}); {hint}")
    return InfrastructureError(
        f"{action}: AWS answered {code or type(exc).__name__} "
        f"({message}); retry, and check the AWS status page if it "
        "persists"
    )


def is_throttle(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES


# Throttling that outlived botocore's own retries gets a few more, slower rounds.
THROTTLE_ATTEMPTS = 3
THROTTLE_MAX_WAIT = 8.0


def call_raw(
    fn: Callable[..., T],
    *args: Any,
    attempts: int = THROTTLE_ATTEMPTS,
    max_wait: float = THROTTLE_MAX_WAIT,
    **kwargs: Any,
) -> T:
    """Call ``fn``, retrying throttling errors with bounded, jittered exponential backoff
    (never past the deadline of a ``within`` block around it)."""
    import tenacity

    by_attempts = tenacity.stop_after_attempt(attempts)
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_throttle),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=max_wait),
        stop=lambda state: by_attempts(state) or past_deadline() is not None,
        reraise=True,
    )
    return retrying(fn, *args, **kwargs)


def call(
    action: str,
    fn: Callable[..., T],
    *args: Any,
    attempts: int = THROTTLE_ATTEMPTS,
    max_wait: float = THROTTLE_MAX_WAIT,
    **kwargs: Any,
) -> T:
    """``call_raw``, and every AWS error translated into a SpotError saying what to do."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call_raw(fn, *args, attempts=attempts, max_wait=max_wait, **kwargs)
    except ClientError as exc:
        raise translate(exc, action) from exc
    except BotoCoreError as exc:  # endpoint down, no credentials, ...
        raise InfrastructureError(
            f"{action}: {type(exc).__name__}: {exc}; check the endpoint "
            "URL, network and credentials"
        ) from exc


def translated(action: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator form of ``call`` for methods that make one AWS call."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> T:
            return call(action, fn, *args, **kwargs)

        return inner

    return wrap
