"""Blocks round-trip through the server by name; bad values say what to fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefect_spot import CheckpointStorage, SpotConfiguration
from prefect_spot.blocks import resolve_config, resolve_storage


def test_spot_configuration_round_trips_by_name(prefect_api):
    config = SpotConfiguration(
        zones=["us-east-2a", "us-west-2b"],
        max_spot_price=1.2,
        max_preemptions=4,
        on_demand_fallback=False,
        provider_options={"start_tick": 100},
    )
    config.save("training-spot", overwrite=True)
    loaded = SpotConfiguration.load("training-spot")
    assert loaded.zones == ["us-east-2a", "us-west-2b"]
    assert loaded.max_spot_price == 1.2 and loaded.max_preemptions == 4
    assert loaded.provider_options == {"start_tick": 100}
    policy = resolve_config("training-spot").retry_policy()
    assert policy.on_demand_fallback is False and policy.max_spot_price == 1.2


def test_checkpoint_storage_round_trips_and_opens(prefect_api, tmp_path):
    CheckpointStorage(uri=tmp_path.as_uri()).save("training-ckpt", overwrite=True)
    storage = resolve_storage("training-ckpt")
    assert storage.uri == tmp_path.as_uri()
    store = storage.open("job-1")
    store.save(3, {"w": b"123"}, {})
    assert store.latest().step == 3 and (tmp_path / "job-1").is_dir()
    assert resolve_storage(tmp_path.as_uri()).uri == tmp_path.as_uri()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_preemptions": -1}, "SpotConfiguration: max_preemptions=-1 must be >= 0"),
        ({"max_spot_price": 0}, "SpotConfiguration: max_spot_price=0 must be > 0 USD/h"),
        (
            {"provider": "gcp-tpu"},
            "provider='gcp-tpu' is not installed; choose one of local, ec2, kubernetes",
        ),
        (
            {"provider": "kubernetes", "provider_options": {"namepsace": "ml"}},
            "unknown kubernetes provider option",
        ),
        ({"capacity_wait": "0s"}, "capacity_wait='0s' must be > 0s"),
        ({"provider": "ec2"}, "provider 'ec2' needs provider_options"),
    ],
)
def test_bad_spot_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        SpotConfiguration(**kwargs)


def test_bad_checkpoint_uri_is_rejected():
    with pytest.raises(ValidationError, match="s3://"):
        CheckpointStorage(uri="ftp://somewhere/ckpt")


def test_old_field_names_still_load_with_a_deprecation_warning():
    with pytest.warns(
        DeprecationWarning, match="max_price_per_hour is deprecated; use max_spot_price"
    ):
        config = SpotConfiguration(max_price_per_hour=0.9, capacity_wait_seconds=2)
    assert config.max_spot_price == 0.9 and config.capacity_wait == 2.0
    assert config.retry_policy().max_spot_price == 0.9
