"""SpotJobOperator at parse time: bad parameters raise ValueError naming the fix; templates."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from airflow.sdk import DAG

from airflow_spot.operators.spot import SpotJobOperator
from airflow_spot.sensors.price_window import SpotPriceWindowSensor

GOOD = {"command": ["python", "-c", "print(1)"], "checkpoint_uri": "file:///tmp/ckpt"}

BAD_CASES = [
    (
        {"provider": "gce"},
        "train: provider='gce' is not installed; choose one of local, ec2, kubernetes",
    ),
    (
        {"provider": "kubernetes", "provider_options": {"namepsace": "ml"}},
        "unknown kubernetes provider option",
    ),
    ({"provider": "ec2"}, "train: provider 'ec2' needs provider_options"),
    ({"provider_options": {"colour": "red"}}, "unknown local provider option"),
    ({"command": []}, "must be a non-empty string or list of strings"),
    ({"command": "   "}, "command is empty"),
    ({"command": ["python", 3]}, "must be a non-empty string or list of strings"),
    ({"checkpoint_uri": "/tmp/ckpt"}, "'/tmp/ckpt' has no scheme"),
    ({"checkpoint_uri": "gs://bucket/x"}, "unsupported scheme 'gs'"),
    ({"image": "python 3.11"}, "is not an image reference"),
    ({"image": ""}, "is not an image reference"),
    ({"zones": "us-east-2a"}, "zones='us-east-2a' must be a list of names"),
    ({"env": {"THREADS": 4}}, "env must map strings to strings"),
    ({"max_preemptions": -1}, "train: max_preemptions=-1 must be >= 0"),
    ({"max_preemptions": 1.5}, "train: max_preemptions=1.5 must be a whole number"),
    ({"max_infrastructure_retries": -2}, "max_infrastructure_retries=-2 must be >= 0"),
    ({"capacity_wait": 0}, "train: capacity_wait=0 must be > 0s"),
    ({"capacity_wait": "soon"}, "capacity_wait='soon' is not a duration"),
    ({"max_spot_price": -0.5}, "max_spot_price=-0.5 must be > 0 USD/h"),
    ({"max_capacity_waits": 0}, "max_capacity_waits=0 must be >= 1"),
    ({"deadline": timedelta(0)}, "deadline=datetime.timedelta\\(0\\) must be > 0s"),
    ({"attempt_timeout": -5}, "attempt_timeout=-5 must be > 0s"),
    ({"poll_interval": 0}, "poll_interval=0 must be > 0s"),
    ({"heartbeat_timeout": "0m"}, "heartbeat_timeout='0m' must be > 0s"),
]


@pytest.mark.parametrize(
    ("override", "message"),
    BAD_CASES,
    ids=[next(iter(o)) + "-" + str(i) for i, (o, _) in enumerate(BAD_CASES)],
)
def test_bad_parameters_raise_value_error_at_parse_time(override, message):
    with DAG("bad_params", schedule=None, start_date=datetime(2026, 1, 1)):
        with pytest.raises(ValueError, match=message.replace("[", r"\[")) as info:
            SpotJobOperator(task_id="train", **{**GOOD, **override})
    assert "\n" not in str(info.value)


SENSOR_BAD = [
    ({}, "pass profile= .* or max_price="),
    ({"max_price": 1.0, "job_hours": 0}, "wait: job_hours=0 must be > 0 h"),
    ({"max_price": 1.0, "window_end": timedelta(hours=1), "job_hours": 2}, "cannot finish within"),
    ({"max_price": -1.0}, "wait: max_price=-1.0 must be > 0 USD/h"),
    ({"max_price": 1.0, "provider": "nope"}, "wait: provider 'nope' is not installed"),
]


@pytest.mark.parametrize(("kwargs", "message"), SENSOR_BAD)
def test_price_window_sensor_bad_parameters(kwargs, message):
    base = {"job_hours": 1.0, "window_end": timedelta(hours=8)}
    with DAG("bad_sensor", schedule=None, start_date=datetime(2026, 1, 1)):
        with pytest.raises(ValueError, match=message):
            SpotPriceWindowSensor(task_id="wait", **{**base, **kwargs})


def test_a_dag_file_with_bad_parameters_is_an_import_error(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_dag.py").write_text(
        "from datetime import datetime\n"
        "from airflow.sdk import DAG\n"
        "from airflow_spot.operators.spot import SpotJobOperator\n"
        "with DAG('bad', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    SpotJobOperator(task_id='t', command=['true'], checkpoint_uri='/no/scheme')\n"
    )
    bag = DagBag(dag_folder=str(tmp_path))
    (error,) = bag.import_errors.values()
    assert "checkpoint_uri: checkpoint store URI '/no/scheme' has no scheme" in error


def test_template_fields_exist_and_render():
    with DAG("tpl", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="train",
            command=["train", "--day", "{{ ds }}"],
            checkpoint_uri="file:///ckpt/{{ ds_nodash }}",
            env={"DAY": "{{ ds }}"},
            provider_options={"url": "{{ var_url }}"},
        )
    assert set(op.template_fields) == {
        "command",
        "checkpoint_uri",
        "provider_options",
        "env",
        "image",
    }
    for name in op.template_fields:
        assert hasattr(op, name)
    op.render_template_fields(
        {"ds": "2026-01-02", "ds_nodash": "20260102", "var_url": "http://127.0.0.1:1"}
    )
    assert op.command == ["train", "--day", "2026-01-02"]
    assert op.checkpoint_uri == "file:///ckpt/20260102"
    assert op.env == {"DAY": "2026-01-02"}
    assert op.provider_options == {"url": "http://127.0.0.1:1"}


def test_templated_checkpoint_uri_passes_parse_time_validation():
    with DAG("tpl2", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(task_id="t", command="python -m x", checkpoint_uri="{{ params.uri }}")
    assert op.checkpoint_uri == "{{ params.uri }}"


def test_deferrable_defaults_to_the_airflow_setting(monkeypatch):
    import inspect

    default = inspect.signature(SpotJobOperator.__init__).parameters["deferrable"].default
    from airflow.sdk import conf

    assert default == conf.getboolean("operators", "default_deferrable", fallback=False)
