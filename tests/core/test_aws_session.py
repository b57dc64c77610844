"""spot_core reaches AWS with an injected session, not the process environment.

With no AWS credential anywhere in the process (no variables, no profile files, no
instance role), a boto3 ``Session`` given to ``open_provider("ec2", session=...)`` and
``open_store(uri, session=...)`` is what every EC2, S3 and SQS call of the provider, its
market and the controller's stores signs with; ``provider.options`` stay credential-free
and reopen the provider with another process's session.
"""

from __future__ import annotations

import json

import boto3
import pytest

from spot_core.adaptors.aws import AwsAccess, access_of
from spot_core.checkpoint import open_store
from spot_core.controller import Controller, JobSpec
from spot_core.errors import ConfigError, InfrastructureError
from spot_core.providers import open_provider
from tests.support.aws_helpers import AWS_ENV, REGION, bucket, client, make_network, unique  # noqa: F401

pytestmark = pytest.mark.timeout(120)
KEY, SECRET = "AKIASESSIONTEST00001", "session-secret-5e2a9c"


@pytest.fixture
def no_env_credentials(aws_env, bucket, tmp_path, monkeypatch):
    net = make_network(aws_env)
    for name in AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return aws_env, net, bucket


def _session() -> boto3.Session:
    return boto3.Session(aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION)


def _options(endpoint: str, net: dict) -> dict:
    return {
        "endpoint_url": endpoint,
        "subnets": net["subnets"],
        "image_id": net["image_id"],
        "instance_types": ["g4dn.xlarge"],
    }


def test_without_a_session_nothing_can_sign(no_env_credentials):
    endpoint, net, bucket = no_env_credentials
    with pytest.raises(InfrastructureError, match="credentials"):
        open_provider("ec2", region=REGION, **_options(endpoint, net))


def test_the_provider_its_market_and_its_stores_use_the_injected_session(no_env_credentials):
    endpoint, net, bucket = no_env_credentials
    provider = open_provider("ec2", session=_session(), **_options(endpoint, net))
    try:
        assert {p.region for p in provider.pools()} == {REGION}  # the session's region
        signer = provider.clients[REGION]._request_signer._credentials
        assert signer.access_key == KEY
        assert provider.market.offers(provider.pools()[:1], 0.0)[0].price_per_hour > 0
        store = provider.open_store(f"s3://{bucket}/{unique('job')}")
        ref = store.save(step=3, payload={"w": b"abc"})
        assert store.load(store.latest()) == {"w": b"abc"} and ref.step == 3
        spec = JobSpec(job_id="j", command=("true",), checkpoint_uri=store.uri, pools=())
        controller = Controller(provider, provider.market)
        assert controller.stores(spec.checkpoint_uri).latest().step == 3
        # Reopened from its options with another session: the options carry no key.
        text = json.dumps(provider.options)
        assert KEY not in text and SECRET not in text
        again = open_provider("ec2", session=_session(), **provider.options)
        assert again.pools() == provider.pools()
    finally:
        provider.close()


def test_open_store_takes_a_session_or_an_access_with_its_endpoint(no_env_credentials):
    endpoint, net, bucket = no_env_credentials
    uri = f"s3://{bucket}/{unique('plain')}"
    open_store(uri, session=_session(), endpoint_url=endpoint).save(step=1, payload={"a": b"1"})
    access = AwsAccess(session=_session(), region=REGION, service_endpoints={"s3": endpoint})
    assert open_store(uri, session=access).latest().step == 1


def test_endpoints_the_caller_names_win_over_the_connections():
    access = AwsAccess(endpoint_url="http://all", service_endpoints={"s3": "http://s3"})
    assert access.endpoint("s3") == "http://s3"
    assert access.endpoint("ec2") == "http://all"
    assert access.endpoint("ec2", "http://mine") == "http://mine"
    assert SECRET not in repr(AwsAccess(session=_session()))


def test_anything_but_a_session_is_one_line():
    with pytest.raises(ConfigError, match="not a boto3 Session or an AwsAccess"):
        access_of({"aws_access_key_id": KEY})
    assert access_of(None) == AwsAccess()


def test_the_stores_of_one_process_share_a_client_per_credentials_and_endpoint(aws_env, bucket):
    """A triggerer opening 1,000 job stores must not build 1,000 boto3 clients (each cost
    about 0.19 s of CPU and 12 MiB): stores with the same credentials, region and
    endpoint share one, and each still reads and writes only its own objects."""
    stores = [open_store(f"s3://{bucket}/{unique('job')}") for _ in range(20)]
    assert len({id(store.backend.client) for store in stores}) == 1
    for i, store in enumerate(stores):
        store.put_object("heartbeat/driver.json", str(i).encode())
    assert [store.get_object("heartbeat/driver.json") for store in stores] == [
        str(i).encode() for i in range(20)
    ]
    session = _session()
    with_session = [open_store(f"s3://{bucket}/{unique('s')}", session=session) for _ in range(2)]
    assert with_session[0].backend.client is with_session[1].backend.client
    assert with_session[0].backend.client is not stores[0].backend.client
    elsewhere = open_store(f"s3://{bucket}/{unique('e')}", endpoint_url=aws_env + "/")
    assert elsewhere.backend.client is not stores[0].backend.client


def test_keys_rotated_in_the_environment_reach_the_next_store(aws_env, bucket, monkeypatch):
    before = open_store(f"s3://{bucket}/{unique('job')}").backend.client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAROTATED000000001")
    after = open_store(f"s3://{bucket}/{unique('job')}").backend.client
    assert after is not before
    assert after._request_signer._credentials.access_key == "AKIAROTATED000000001"
