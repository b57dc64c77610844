"""SpotJobOperator and @task.spot against the settings model: for every knob each exposes,
the default is the model's and a value the model refuses is refused at parse time, in
one line naming the task."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest
from airflow.sdk import DAG, task

from airflow_spot.operators.spot import SpotJobOperator
from spot_core.errors import ConfigError
from spot_core.settings import DECORATOR, KNOBS_BY_NAME, OPERATOR, SpotSettings, knobs_for

GOOD = {"command": ["python", "-c", "print(1)"], "checkpoint_uri": "file:///tmp/ckpt"}
OPERATOR_KNOBS = knobs_for(OPERATOR)
DECORATOR_KNOBS = knobs_for(DECORATOR)


def _bad(k):
    """A value the knob refuses (the same for the model and the surface)."""
    if k.allowed is not None:
        return "nope"
    if k.kind == "duration":
        return "0s" if k.strict else -1
    return {
        "int": -1 if not k.minimum else 0,
        "number": 0,
        "bool": "yes",
        "text": "",
        "names": "us-east-2a",
        "mapping": "region=us-east-1",
    }[k.kind]


def _operator(**kwargs) -> SpotJobOperator:
    with DAG("settings_table", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotJobOperator(task_id="train", **{**GOOD, **kwargs})


def _decorated(**kwargs):
    def step():
        return 1

    with DAG("settings_table", schedule=None, start_date=datetime(2026, 1, 1)):
        return task.spot(checkpoint_uri="file:///tmp/ckpt", **kwargs)(step)().operator


def test_the_surfaces_expose_exactly_their_knobs():
    operator = set(inspect.signature(SpotJobOperator.__init__).parameters) & set(KNOBS_BY_NAME)
    assert operator == {k.name for k in OPERATOR_KNOBS}
    from airflow_spot.decorators.spot import _SpotDecoratedOperator

    decorator = set(inspect.signature(_SpotDecoratedOperator.__init__).parameters) & set(
        KNOBS_BY_NAME
    )
    assert decorator == {k.name for k in DECORATOR_KNOBS}


@pytest.mark.parametrize("k", OPERATOR_KNOBS, ids=[k.name for k in OPERATOR_KNOBS])
def test_operator_default_is_the_models(k):
    parameter = inspect.signature(SpotJobOperator.__init__).parameters[k.name]
    if k.kind != "mapping":  # provider_options=None means {}, like env
        assert parameter.default == k.default
    assert k.read(_operator().settings) == k.default


@pytest.mark.parametrize("k", OPERATOR_KNOBS, ids=[k.name for k in OPERATOR_KNOBS])
def test_operator_refuses_what_the_model_refuses(k):
    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: _bad(k)})
    with pytest.raises(ValueError) as info:
        _operator(**{k.name: _bad(k)})
    message = str(info.value)
    assert message.startswith("train: ") and k.name in message and "\n" not in message


@pytest.mark.parametrize("k", DECORATOR_KNOBS, ids=[k.name for k in DECORATOR_KNOBS])
def test_decorator_default_is_the_models(k):
    from airflow_spot.decorators.spot import _SpotDecoratedOperator

    parameter = inspect.signature(_SpotDecoratedOperator.__init__).parameters[k.name]
    assert parameter.default == k.default
    assert k.read(_decorated().settings) == k.default


@pytest.mark.parametrize("k", DECORATOR_KNOBS, ids=[k.name for k in DECORATOR_KNOBS])
def test_decorator_refuses_what_the_model_refuses(k):
    with pytest.raises(ConfigError):
        SpotSettings.build(**{k.name: _bad(k)})
    with pytest.raises(ValueError) as info:
        _decorated(**{k.name: _bad(k)})
    message = str(info.value)
    assert message.startswith("step: ") and k.name in message and "\n" not in message


def test_operator_takes_durations_in_any_form_and_builds_the_policy():
    op = _operator(
        capacity_wait="2m", attempt_timeout="6h", heartbeat_timeout=90, max_spot_price=0.8
    )
    assert (
        op.settings.capacity_wait_seconds,
        op.settings.attempt_timeout_seconds,
        op.settings.heartbeat_timeout_seconds,
    ) == (120.0, 21600.0, 90.0)
    assert op.policy.capacity_wait_seconds == 120.0 and op.policy.max_spot_price == 0.8
    assert op.settings.controller_options()["heartbeat_timeout_seconds"] == 90.0


def test_operator_old_names_still_work_with_a_warning():
    with pytest.warns(DeprecationWarning, match="train: capacity_wait_seconds is deprecated"):
        op = _operator(capacity_wait_seconds=5)
    assert op.settings.capacity_wait_seconds == 5.0 and op.policy.capacity_wait_seconds == 5.0


def test_operator_takes_the_deadline_knobs_in_any_form():
    from datetime import timedelta

    op = _operator(
        deadline=timedelta(hours=2),
        work="30m",
        total_steps=10,
        restart_overhead=60,
        deadline_policy="greedy",
    )
    assert (
        op.settings.deadline_capacity_seconds,
        op.settings.work_capacity_seconds,
        op.settings.total_steps,
        op.settings.restart_overhead_capacity_seconds,
        op.settings.deadline_policy,
    ) == (7200.0, 1800.0, 10, 60.0, "greedy")
    when = datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert _operator(deadline="2026-12-01T08:00Z").settings.deadline_at == when
    assert _operator(deadline=datetime(2026, 12, 1, 8)).settings.deadline_at == when


# -- bounds: past a knob's maximum, the model's own line (tests/support/bounds_cases.py) ----------
from tests.support.bounds_cases import bounded, model_line, over  # noqa: E402

OPERATOR_BOUNDED, DECORATOR_BOUNDED = bounded(OPERATOR), bounded(DECORATOR)


@pytest.mark.parametrize("k", OPERATOR_BOUNDED, ids=[k.name for k in OPERATOR_BOUNDED])
def test_operator_refuses_past_the_maximum_with_the_models_line(k):
    with pytest.raises(ValueError) as info:
        _operator(**{k.name: over(k)})
    assert str(info.value) == f"train: {model_line(k, over(k))}"


@pytest.mark.parametrize("k", DECORATOR_BOUNDED, ids=[k.name for k in DECORATOR_BOUNDED])
def test_decorator_refuses_past_the_maximum_with_the_models_line(k):
    with pytest.raises(ValueError) as info:
        _decorated(**{k.name: over(k)})
    assert str(info.value) == f"step: {model_line(k, over(k))}"
