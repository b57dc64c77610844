"""The settings model: one parser for durations, one-line errors, builders, the provider
registry, and the CLI (`spot-pipelines run`) derived from it."""

from __future__ import annotations

import math
import warnings
from datetime import timedelta

import pytest

from spot_core.cli import build_parser, main
from spot_core.commands.flags import cli_flag, settings_from_cli
from spot_core.errors import ConfigError
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import check_provider, open_provider, provider_names
from spot_core.settings import (
    CLI,
    KNOBS,
    SURFACES,
    SpotSettings,
    format_duration,
    knob,
    knobs_for,
    parse_duration,
)


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90.0),
        (2.5, 2.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (" 5M ", 300.0),
        (timedelta(minutes=3), 180.0),
    ],
)
def test_durations_take_seconds_timedeltas_and_unit_strings(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5x", "m5", "", True, None, math.nan, [5]])
def test_a_bad_duration_is_one_line_naming_the_forms(value):
    with pytest.raises(ConfigError) as info:
        parse_duration(value, name="capacity_wait")
    message = str(info.value)
    assert message.startswith("capacity_wait=") and "'5m'" in message and "\n" not in message


def test_format_duration_is_the_shortest_exact_form():
    assert [format_duration(s) for s in (60, 600, 86400, 5400, 1.5)] == [
        "1m",
        "10m",
        "1d",
        "90m",
        "1.5s",
    ]


def test_every_knob_is_declared_whole():
    for k in KNOBS:
        assert k.help.strip() and k.surfaces and k.surfaces <= set(SURFACES), k.name
        assert k.parse(k.default) == k.default, k.name  # the default passes its own check
    # every field is a knob's, but the deadline's absolute form, which the knob fills too
    assert {f for f in SpotSettings.__dataclass_fields__} == {k.field for k in KNOBS} | {
        k.absolute_field for k in KNOBS if k.absolute
    }
    durations = [k for k in KNOBS if k.kind == "duration"]
    # a surface shows the knob's name; the field carries the unit (capacity time as such)
    assert not [k.name for k in durations if k.name.endswith(("_seconds", "_hours"))]
    assert all(k.field.endswith("_seconds") for k in durations)
    capacity = {"deadline", "work", "restart_overhead"}
    assert {k.name for k in durations if k.field.endswith("_capacity_seconds")} == capacity
    assert all(k.absolute_field.endswith("_at") for k in KNOBS if k.absolute)


def test_defaults_are_the_documented_ones():
    s = SpotSettings()
    assert (
        s.capacity_wait_seconds,
        s.max_capacity_waits,
        s.attempt_timeout_seconds,
        s.heartbeat_timeout_seconds,
        s.observe_failure_timeout_seconds,
        s.min_on_demand_seconds,
    ) == (60.0, 10, 86400.0, 300.0, 180.0, 600.0)
    assert s.provider == "local" and s.max_spot_price is None and s.max_preemptions == 3


@pytest.mark.parametrize(
    "values, message",
    [
        ({"capacity_wait": 0}, "train: capacity_wait=0 must be > 0s"),
        ({"capacity_wait": "-5m"}, "train: capacity_wait='-5m' is not a duration"),
        ({"max_preemptions": -1}, "train: max_preemptions=-1 must be >= 0"),
        ({"max_preemptions": True}, "train: max_preemptions=True must be a whole number"),
        ({"max_capacity_waits": 0}, "train: max_capacity_waits=0 must be >= 1"),
        ({"max_spot_price": 0}, "train: max_spot_price=0 must be > 0 USD/h"),
        ({"max_spot_price": "cheap"}, "train: max_spot_price='cheap' must be a number USD/h"),
        ({"on_demand_fallback": "yes"}, "train: on_demand_fallback='yes' must be True or False"),
        ({"zones": "us-east-2a"}, "train: zones='us-east-2a' must be a list of names"),
        (
            {"provider": "gke-autopilot"},
            "train: provider='gke-autopilot' is not installed; "
            "choose one of local, ec2, kubernetes",
        ),
        (
            {"provider": "kubernetes", "provider_options": {"namepsace": "ml"}},
            "train: unknown kubernetes provider option(s) ['namepsace']",
        ),
        (
            {"provider": "ec2"},
            "train: provider 'ec2' needs provider_options ['subnets', "
            "'image_id', 'instance_types']",
        ),
        (
            {"provider_options": {"colour": "red"}},
            "train: unknown local provider option(s) ['colour']",
        ),
        (
            {"provider_options": {"watch_poll_interval": 0}},
            "train: local provider option watch_poll_interval=0 must be a finite number of "
            "seconds > 0",
        ),
        ({"deadline_policy": "greedy"}, "train: deadline_policy='greedy' needs deadline and work"),
        (
            {"deadline_policy": "psychic", "deadline": "2h", "work": "1h"},
            "train: deadline_policy='psychic' is not one of",
        ),
        ({"capacity_wiat": 5}, "train: unknown setting(s) ['capacity_wiat']; choose from"),
    ],
)
def test_bad_values_are_one_line_naming_where_and_the_fix(values, message):
    with pytest.raises(ConfigError) as info:
        SpotSettings.build(where="train", **values)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_old_names_work_with_a_deprecation_warning_and_not_twice():
    with pytest.warns(
        DeprecationWarning, match="capacity_wait_seconds is deprecated; use capacity_wait"
    ):
        settings = SpotSettings.build(
            capacity_wait_seconds=5, max_price_per_hour=0.8, min_on_demand_seconds="2m"
        )
    assert (
        settings.capacity_wait_seconds,
        settings.max_spot_price,
        settings.min_on_demand_seconds,
    ) == (5.0, 0.8, 120.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match="old name of capacity_wait; pass only"):
            SpotSettings.build(capacity_wait=1, capacity_wait_seconds=2)


def test_retry_policy_defaults_are_the_models():
    assert SpotSettings().retry_policy() == RetryPolicy()


def test_builders_carry_every_knob_in_seconds():
    settings = SpotSettings.build(
        max_preemptions=1,
        max_user_retries=2,
        max_infrastructure_retries=4,
        on_demand_fallback=False,
        return_to_spot=False,
        min_on_demand="15m",
        capacity_wait=timedelta(seconds=30),
        max_capacity_waits=7,
        max_spot_price=1.25,
        attempt_timeout="2h",
        poll_interval="5s",
        heartbeat_timeout="4m",
        heartbeat_uri="s3://beats/drivers",
        observe_failure_timeout=90,
        checkpoint_cost="45s",
        checkpoint_interval_min="2m",
        checkpoint_interval_max="30m",
        handover="off",
    )
    assert settings.retry_policy() == RetryPolicy(
        max_preemptions=1,
        max_user_retries=2,
        max_infrastructure_retries=4,
        on_demand_fallback=False,
        return_to_spot=False,
        min_on_demand_seconds=900.0,
        capacity_wait_seconds=30.0,
        max_capacity_waits=7,
        max_spot_price=1.25,
    )
    assert settings.retry_policy(max_user_retries=9).max_user_retries == 9
    assert settings.controller_options() == {
        "poll_interval_seconds": 5.0,
        "attempt_timeout_seconds": 7200.0,
        "heartbeat_timeout_seconds": 240.0,
        "heartbeat_uri": "s3://beats/drivers",
        "observe_failure_timeout_seconds": 90.0,
        "checkpoint_cost_seconds": 45.0,
        "checkpoint_interval_min_seconds": 120.0,
        "checkpoint_interval_max_seconds": 1800.0,
        "take_over": False,
        "handover": "off",
    }


def test_the_provider_registry_refuses_what_is_not_built():
    assert provider_names() == ("local", "ec2", "kubernetes")
    with pytest.raises(
        ConfigError, match="provider 'nomad' is not installed; choose one of local, ec2, kubernetes"
    ):
        open_provider("nomad")
    with pytest.raises(ConfigError, match=r"unknown ec2 provider option\(s\) \['colour'\]"):
        check_provider("ec2", {"colour": "red"})
    check_provider("ec2", {"subnets": ["subnet-1"], "image_id": "ami-1"}, ["g5.xlarge"])
    check_provider("local", {"time_scale": 60.0, "start_tick": 3, "watch_poll_interval": 1})


@pytest.mark.parametrize(
    "prices",
    [
        3.0,
        {"g5.xlarge": "cheap"},
        {"g5.xlarge": -1.0},
        {"g5.xlarge": float("nan")},
        {"g5.xlarge": True},
        {"eu-west-1": {"g5.xlarge": float("inf")}},
    ],
)
def test_ec2_on_demand_prices_that_are_no_prices_are_one_line(prices):
    good = {"subnets": ["subnet-1"], "image_id": "ami-1"}
    with pytest.raises(ConfigError, match="on_demand_prices") as caught:
        check_provider("ec2", {**good, "on_demand_prices": prices}, ["g5.xlarge"])
    assert "\n" not in str(caught.value) and "g5.xlarge" in str(caught.value)
    check_provider("ec2", {**good, "on_demand_prices": {"g5.xlarge": 1.006}}, ["g5.xlarge"])
    check_provider(
        "ec2", {**good, "on_demand_prices": {"eu-west-1": {"g5.xlarge": 1}}}, ["g5.xlarge"]
    )


# -- the command line, a surface of the model -------------------------------------------------
def _cli_args(*flags: str):
    return build_parser().parse_args(["run", *flags, "--", "true"])


def _bad_text(k) -> str:
    if k.allowed is not None:
        return "nope"
    if k.kind in ("int", "number") and k.minimum is not None:
        return str(int(k.minimum) - (0 if k.strict else 1))
    if k.kind == "duration":
        return "0s" if k.strict else "soon"
    return ""


CLI_VALUED = [k for k in knobs_for(CLI) if k.kind != "bool"]


def test_cli_defaults_are_the_models():
    settings = settings_from_cli(_cli_args())
    for k in knobs_for(CLI):
        assert k.read(settings) == k.default, k.name
    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for k in knobs_for(CLI):
        assert cli_flag(k) in help_text, k.name


@pytest.mark.parametrize("k", CLI_VALUED, ids=[k.name for k in CLI_VALUED])
def test_cli_refuses_what_the_model_refuses_in_one_line(k, capsys):
    bad = _bad_text(k)
    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: bad if k.kind in ("text", "duration") else float(bad)})
    assert main(["run", cli_flag(k), bad, "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"spot-pipelines run: error: {cli_flag(k)}: "), err


def test_cli_values_reach_the_model():
    args = _cli_args(
        "--capacity-wait",
        "2m",
        "--heartbeat-timeout",
        "90s",
        "--attempt-timeout",
        "6h",
        "--observe-failure-timeout",
        "1m",
        "--max-spot-price",
        "0.7",
        "--no-fallback",
        "--no-return-to-spot",
        "--max-preemptions",
        "5",
    )
    settings = settings_from_cli(args)
    assert (
        settings.capacity_wait_seconds,
        settings.heartbeat_timeout_seconds,
        settings.attempt_timeout_seconds,
        settings.observe_failure_timeout_seconds,
        settings.max_spot_price,
    ) == (120.0, 90.0, 21600.0, 60.0, 0.7)
    assert settings.on_demand_fallback is False and settings.return_to_spot is False
    assert settings.max_preemptions == 5
    assert knob("heartbeat_timeout").default == 300.0


def test_a_provider_refused_where_none_is_installed_names_what_to_install(monkeypatch):
    # An environment whose metadata declares no provider (a copied tree, no `pip install`):
    # the refusal says what to install rather than "choose one of" and nothing.
    import spot_core.plugins as plugins

    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    plugins.named.cache_clear()
    try:
        with pytest.raises(ConfigError) as refused:
            SpotSettings.build(where="train", provider="local")
        assert "pip install spot-pipelines" in str(refused.value)
        assert "choose one of" not in str(refused.value)
        assert "\n" not in str(refused.value)
    finally:
        monkeypatch.undo()
        plugins.named.cache_clear()
