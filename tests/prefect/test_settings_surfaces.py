"""The SpotConfiguration block, the spot worker's variables (its work-pool form) and job
configuration, spot_task and SpotTaskRunner against the settings model: for every knob
each exposes, the default and the form's description are the model's, and a value the
model refuses is refused by the surface too."""

from __future__ import annotations

import inspect
from datetime import UTC

import pytest
from pydantic import ValidationError

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_task
from prefect_spot._settings import description
from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables, SpotWorker
from spot_core.errors import ConfigError
from spot_core.settings import (
    BLOCK,
    KNOBS_BY_NAME,
    SPOT_TASK,
    TASK_RUNNER,
    WORKER,
    SpotSettings,
    knobs_for,
)

BLOCK_KNOBS, WORKER_KNOBS = knobs_for(BLOCK), knobs_for(WORKER)
SPOT_TASK_KNOBS, RUNNER_KNOBS = knobs_for(SPOT_TASK), knobs_for(TASK_RUNNER)
MODELS = {
    "block": SpotConfiguration,
    "variables": SpotJobVariables,
    "job_configuration": SpotJobConfiguration,
}


def _bad(k):
    """A value the knob refuses (the same for the model and the surface)."""
    if k.allowed is not None:
        return "nope"
    if k.kind == "duration":
        return "0s" if k.strict else -1
    return {
        "int": -1 if not k.minimum else 0,
        "number": 0,
        "bool": "maybe",
        "text": "",
        "names": "us-east-2a",
        "mapping": "region=us-east-1",
    }[k.kind]


def _cases(knobs, surfaces):
    return [(name, k) for name in surfaces for k in knobs]


FIELD_CASES = _cases(BLOCK_KNOBS, ["block"]) + _cases(
    WORKER_KNOBS, ["variables", "job_configuration"]
)
FIELD_IDS = [f"{name}-{k.name}" for name, k in FIELD_CASES]


def test_the_surfaces_expose_exactly_their_knobs():
    assert set(SpotConfiguration.model_fields) & set(KNOBS_BY_NAME) == {k.name for k in BLOCK_KNOBS}
    for model in (SpotJobVariables, SpotJobConfiguration):
        assert set(model.model_fields) & set(KNOBS_BY_NAME) == {k.name for k in WORKER_KNOBS}
    assert set(inspect.signature(spot_task).parameters) & set(KNOBS_BY_NAME) == {
        k.name for k in SPOT_TASK_KNOBS
    }
    assert set(inspect.signature(SpotTaskRunner).parameters) & set(KNOBS_BY_NAME) == {
        k.name for k in RUNNER_KNOBS
    }


@pytest.mark.parametrize("surface, k", FIELD_CASES, ids=FIELD_IDS)
def test_field_default_and_description_are_the_models(surface, k):
    model = MODELS[surface]
    field = model.model_fields[k.name]
    value = field.default_factory() if field.default_factory else field.default
    assert k.parse(value) == k.default
    assert field.description == description(k.name) and k.help in field.description
    if surface != "job_configuration":
        assert k.parse(getattr(model(), k.name)) == k.default


@pytest.mark.parametrize("surface, k", FIELD_CASES, ids=FIELD_IDS)
def test_field_refuses_what_the_model_refuses(surface, k):
    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: _bad(k)})
    with pytest.raises(ValidationError, match=f"{k.name}="):
        MODELS[surface](**{k.name: _bad(k)})


def test_work_pool_form_describes_every_knob_with_its_default():
    template = SpotWorker.get_default_base_job_template()
    properties = template["variables"]["properties"]
    for k in WORKER_KNOBS:
        assert properties[k.name]["description"] == description(k.name)
        if k.default not in (None, {}, ()):
            assert properties[k.name]["default"] == k.default, k.name
        assert template["job_configuration"][k.name] == "{{ " + k.name + " }}"
    assert properties["provider"]["enum"] == ["local", "ec2", "kubernetes"]


@pytest.mark.parametrize("k", SPOT_TASK_KNOBS, ids=[k.name for k in SPOT_TASK_KNOBS])
def test_spot_task_default_is_the_models_and_refuses_the_same(k):
    assert inspect.signature(spot_task).parameters[k.name].default == k.default
    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: _bad(k)})
    with pytest.raises(ConfigError, match=f"spot_task: {k.name}="):
        spot_task(**{k.name: _bad(k)})


@pytest.mark.parametrize("k", RUNNER_KNOBS, ids=[k.name for k in RUNNER_KNOBS])
def test_task_runner_default_is_the_models_and_refuses_the_same(k):
    assert inspect.signature(SpotTaskRunner).parameters[k.name].default == k.default
    assert getattr(SpotTaskRunner(), k.name) == k.default
    with pytest.raises(ConfigError, match=f"SpotTaskRunner: {k.name}="):
        SpotTaskRunner(**{k.name: _bad(k)})


def test_durations_in_any_form_reach_the_policy_and_the_controller_options():
    config = SpotConfiguration(
        capacity_wait="2m", heartbeat_timeout="4m", attempt_timeout="6h", max_spot_price=0.9
    )
    assert config.capacity_wait == 120.0
    policy = config.retry_policy(max_user_retries=2)
    assert (policy.capacity_wait_seconds, policy.max_spot_price, policy.max_user_retries) == (
        120.0,
        0.9,
        2,
    )
    assert config.controller_options() == {
        "poll_interval_seconds": 1.0,
        "attempt_timeout_seconds": 21600.0,
        "heartbeat_timeout_seconds": 240.0,
        "heartbeat_uri": None,
        "observe_failure_timeout_seconds": 180.0,
        "checkpoint_cost_seconds": 60.0,
        "checkpoint_interval_min_seconds": 60.0,
        "checkpoint_interval_max_seconds": 3600.0,
        "take_over": False,
        "handover": None,
    }
    variables = SpotJobVariables(capacity_wait="90s", max_spot_price=0.5)
    configuration = SpotJobConfiguration(
        **variables.model_dump(exclude={"name", "labels", "command", "env"})
    )
    assert configuration.spot_configuration().retry_policy().capacity_wait_seconds == 90.0
    assert SpotTaskRunner(checkpoint_every="5m").checkpoint_every == 300.0


def test_old_worker_variable_names_still_load_with_a_warning():
    with pytest.warns(DeprecationWarning, match="max_price_per_hour is deprecated"):
        variables = SpotJobVariables(max_price_per_hour=1.5, capacity_wait_seconds=0.5)
    assert variables.max_spot_price == 1.5 and variables.capacity_wait == 0.5
    with pytest.warns(DeprecationWarning, match="checkpoint_every_seconds is deprecated"):
        assert SpotTaskRunner(checkpoint_every_seconds=2).checkpoint_every == 2.0


def test_the_deadline_knobs_take_any_form_on_the_block_and_the_worker():
    from datetime import datetime

    config = SpotConfiguration(
        deadline="2h", work=1800, total_steps=10, restart_overhead="1m", deadline_policy="greedy"
    )
    assert (
        config.deadline,
        config.work,
        config.total_steps,
        config.restart_overhead,
        config.deadline_policy,
    ) == (7200.0, 1800.0, 10, 60.0, "greedy")
    when = datetime(2026, 12, 1, 8, tzinfo=UTC)
    variables = SpotJobVariables(deadline="2026-12-01T08:00Z", work="1h")
    assert variables.deadline == when
    configuration = SpotJobConfiguration(
        **variables.model_dump(exclude={"name", "labels", "command", "env"})
    )
    assert configuration.spot_configuration().settings().deadline_at == when


# -- bounds: past a knob's maximum, the model's own line (tests/support/bounds_cases.py) ----------
from tests.support.bounds_cases import bounded, model_line, over  # noqa: E402

BOUND_CASES = [("block", k) for k in bounded(BLOCK)] + [
    (name, k) for name in ("variables", "job_configuration") for k in bounded(WORKER)
]
PREFIX = {
    "block": "SpotConfiguration",
    "variables": "spot worker",
    "job_configuration": "spot worker",
}


@pytest.mark.parametrize(
    "surface, k", BOUND_CASES, ids=[f"{surface}-{k.name}" for surface, k in BOUND_CASES]
)
def test_block_and_worker_refuse_past_the_maximum_with_the_models_line(surface, k):
    with pytest.raises(ValidationError) as info:
        MODELS[surface](**{k.name: over(k)})
    assert f"{PREFIX[surface]}: {model_line(k, over(k))}" in str(info.value)


SPOT_TASK_BOUNDED = bounded(SPOT_TASK)


@pytest.mark.parametrize("k", SPOT_TASK_BOUNDED, ids=[k.name for k in SPOT_TASK_BOUNDED])
def test_spot_task_refuses_past_the_maximum_with_the_models_line(k):
    with pytest.raises(ConfigError) as info:
        spot_task(**{k.name: over(k)})
    assert str(info.value) == f"spot_task: {model_line(k, over(k))}"
