"""Bad input to the Airflow surfaces: one line naming the task, the argument and the fix,
and nothing damaged.

Each bad argument of ``SpotJobOperator``, ``@task.spot``, ``SpotPriceWindowSensor``,
``PriceWindowTimetable`` and the triggers is refused when the DAG is parsed: a real
``DagBag`` over a folder holding one DAG file per case records one import error line, the
good DAG beside it still loads, and nothing is created. Values that only exist at run
time (templates as rendered, zones the provider lacks) fail the task in one line before
anything launches. Records read back (the task state store, a trigger's event or kwargs)
that are corrupt or foreign are one clear error, and the stored record is left as it was.
"""

from __future__ import annotations

import math
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator
from airflow_spot.triggers.price_window import SpotPriceWindowTrigger
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core.model import JobRecord, Pool
from tests.support.task_context import TI, StateStore

GITHUB = "ghp_" + "a" * 36
NAN, INF = float("nan"), float("inf")
OPERATOR_CASES = [  # (argument, bad value as Python source, words the line must hold)
    ("max_preemptions", "-1", ">= 0"),
    ("max_preemptions", "True", "whole number"),
    ("max_preemptions", "1.5", "whole number"),
    ("max_preemptions", "'3'", "whole number"),
    ("max_capacity_waits", "0", ">= 1"),
    ("max_infrastructure_retries", "-2", ">= 0"),
    ("max_spot_price", "float('nan')", "number"),
    ("max_spot_price", "float('inf')", "number"),
    ("max_spot_price", "-0.5", "> 0"),
    ("max_spot_price", "0", "> 0"),
    ("max_spot_price", "'cheap'", "number"),
    ("max_spot_price", "True", "number"),
    ("capacity_wait", "float('nan')", "duration"),
    ("capacity_wait", "float('inf')", "duration"),
    ("capacity_wait", "-5", "> 0"),
    ("capacity_wait", "'0s'", "> 0"),
    ("capacity_wait", "'soon'", "duration"),
    ("capacity_wait", "True", "duration"),
    ("capacity_wait", "'inf'", "duration"),
    ("capacity_wait", "'nan'", "duration"),
    ("deadline", "'0s'", "> 0"),
    ("deadline", "timedelta(hours=-1)", "> 0"),
    ("attempt_timeout", "0", "> 0"),
    ("poll_interval", "-1", "> 0"),
    ("heartbeat_timeout", "float('nan')", "duration"),
    ("observe_failure_timeout", "[]", "duration"),
    ("min_on_demand", "-1", ">= 0"),
    ("on_demand_fallback", "'yes'", "True or False"),
    ("return_to_spot", "1", "True or False"),
    ("deferrable", "'yes'", "True or False"),
    ("zones", "'us-east-2a'", "list of names"),
    ("zones", "['']", "list of names"),
    ("zones", "[1]", "list of names"),
    ("zones", "{'us-east-2a': 1}", "list of names"),
    ("provider", "'gcp'", "not installed; choose one of"),
    ("provider", "''", "not installed"),
    ("provider", "None", "not installed"),
    ("provider_options", "'url=http://x'", "mapping"),
    ("provider_options", "{'regoin': 'us-east-1'}", "unknown local provider option"),
    ("provider_options", "{'time_scale': float('inf')}", "time_scale"),
    ("provider_options", "{'time_scale': 0}", "time_scale"),
    ("provider_options", "{'start_tick': -1}", "start_tick"),
    ("provider_options", "{'start_tick': True}", "start_tick"),
    ("provider_options", "{'url': 'ftp://x'}", "http://"),
    ("provider_options", "{'traces': 'a.csv'}", "list of trace file paths"),
    ("provider_options", "{'aws_secret_access_key': 'x'}", "credential"),
    ("provider_options", "{'url': 'http://u:pw@127.0.0.1:1'}", "a URL with a password"),
    ("provider_options", "{'workdir': object()}", "non-empty string"),
    ("command", "''", "command"),
    ("command", "[]", "command"),
    ("command", "123", "command"),
    ("command", "['python', 1]", "command"),
    ("checkpoint_uri", "''", "checkpoint_uri"),
    ("checkpoint_uri", "'relative/ckpt'", "no scheme"),
    ("checkpoint_uri", "'/abs/ckpt'", "file:///abs/ckpt"),
    ("checkpoint_uri", "'ftp://host/ckpt'", "unsupported scheme"),
    ("checkpoint_uri", "'file://host/x'", "names host"),
    ("checkpoint_uri", "'file:///'", "absolute"),
    ("checkpoint_uri", "'s3://'", "no bucket"),
    ("checkpoint_uri", "'file:///c?v=1'", "query"),
    ("checkpoint_uri", "'file:///a%00b'", "NUL"),
    ("checkpoint_uri", "None", "checkpoint_uri"),
    ("image", "'-v/:/host'", "leading '-'"),
    ("image", "'--privileged'", "leading '-'"),
    ("image", "'a b'", "image"),
    ("image", "''", "image"),
    ("image", "'img\\x07'", "image"),
    ("env", "['A=1']", "mapping"),
    ("env", "{'N': 1}", "strings"),
]
EC2 = (
    "{'region': 'us-east-1', 'subnets': ['subnet-1'], 'image_id': 'ami-1', "
    "'instance_types': ['g5.xlarge']"
)
EC2_CASES = [
    ("provider_options", EC2 + ", 'aws_access_key_id': 'AKIA'}", "credential"),
    ("provider_options", EC2 + ", 'extra_tags': {'t': '" + GITHUB + "'}}", "a GitHub token"),
    ("provider_options", EC2 + ", 'endpoint_url': 'https://u:p@aws.example'}", "password"),
    ("provider_options", EC2 + ", 'subnet': ['subnet-1']}", "unknown ec2 provider option"),
    (
        "provider_options",
        "{'region': 'us-east-1', 'subnets': [], 'image_id': 'ami-1', "
        "'instance_types': ['g5.xlarge']}",
        "needs provider_options",
    ),
    (
        "provider_options",
        "{'region': 'us-east-1', 'subnets': ['s'], 'image_id': 'ami-1', 'instance_types': []}",
        "instance_types",
    ),
    ("env", "{'DATABASE_URL': 'postgres://u:p@db/x'}", "DATABASE_URL"),
    ("env", "{'HF_TOKEN': 'x'}", "HF_TOKEN"),
    ("env", "{'DEPLOY': '-----BEGIN RSA PRIVATE KEY-----'}", "PEM"),
]
DECORATOR_CASES = [
    ("checkpoint_uri", "'file://host/x'", "names host"),
    ("checkpoint_uri", "'s3://'", "no bucket"),
    ("checkpoint_uri", "'ftp://x/y'", "unsupported scheme"),
    ("checkpoint_uri", "''", "checkpoint_uri"),
    ("cloud", "'aws-ish'", "is not one of"),
    ("max_preemptions", "-1", ">= 0"),
    ("max_preemptions", "False", "whole number"),
    ("keep_checkpoints", "0", ">= 1"),
    ("checkpoint_every", "float('nan')", "duration"),
    ("checkpoint_every", "'0s'", "> 0"),
    ("checkpoint_every_steps", "0", ">= 1"),
    ("checkpoint_every_steps", "2.5", "whole number"),
    ("notice_poll_interval", "float('inf')", "duration"),
    ("notice_poll_interval", "-1", "> 0"),
    ("metadata_endpoint", "'169.254.169.254'", "http://"),
]
PROFILE = (
    "{'zone_prices': {'z': [0.3] * 168}, 'zone_availability': {'z': [1.0] * 168}, "
    "'on_demand_price': 1.0}"
)
SENSOR_CASES = [
    ("job_hours", "float('nan')", "job_hours"),
    ("job_hours", "float('inf')", "job_hours"),
    ("job_hours", "-1", "job_hours"),
    ("job_hours", "True", "job_hours"),
    ("job_hours", "'2'", "job_hours"),
    ("max_price", "float('nan')", "max_price"),
    ("max_price", "float('inf')", "max_price"),
    ("max_price", "-1", "max_price"),
    ("max_price", "'1'", "max_price"),
    ("provider", "'gce'", "not installed"),
    ("provider_options", "{'nope': 1}", "unknown local provider option"),
    ("provider_options", "{'url': 'http://u:p@h:1'}", "password"),
    ("zones", "'us-east-2a'", "list of names"),
    ("window_end", "'tomorrow'", "window_end"),
    ("window_end", "timedelta(hours=1)", "cannot finish"),
    ("deferrable", "'no'", "True or False"),
    ("profile", "{'zone_prices': {}}", "profile"),
    ("profile", "'cheap'", "profile"),
    ("profile", PROFILE.replace("'on_demand_price': 1.0", "'on_demand_price': 'x'"), "malformed"),
    ("profile", PROFILE.replace("[1.0] * 168", "[float('nan')] * 168"), "finite"),
]
TIMETABLE_CASES = [
    ("job_hours", "float('nan')", "job_hours"),
    ("job_hours", "True", "job_hours"),
    ("job_hours", "9", "fit in the 8 h window"),
    ("job_hours", "0", "job_hours"),
    ("start_hour", "True", "whole hours"),
    ("start_hour", "-1", "whole hours"),
    ("end_hour", "25", "whole hours"),
    ("end_hour", "8.5", "whole hours"),
    ("profile", "{'zone_prices': 1}", "profile"),
    ("profile", "None", "profile"),
    ("profile", PROFILE.replace("[0.3] * 168", "[0.3] * 24"), "168"),
]

HEADER = """
import os, sys
from datetime import datetime, timedelta
from airflow.sdk import DAG, task
from airflow_spot.operators.spot import SpotJobOperator
from airflow_spot.sensors.price_window import SpotPriceWindowSensor
from airflow_spot.timetables.price_window import PriceWindowTimetable
CKPT = {ckpt!r}
PROFILE = {profile}
"""
OPERATOR_DAG = """
args = dict(command=["python", "-c", "print(1)"], checkpoint_uri=CKPT)
args[{arg!r}] = {value}
with DAG("bad", schedule=None, start_date=datetime(2026, 1, 1)):
    SpotJobOperator(task_id="train", **{{**{base}, **args}})
"""
DECORATOR_DAG = """
args = dict(checkpoint_uri=CKPT)
args[{arg!r}] = {value}
with DAG("bad", schedule=None, start_date=datetime(2026, 1, 1)):
    @task.spot(task_id="train", **args)
    def step():
        return 1
    step()
"""
SENSOR_DAG = """
args = dict(job_hours=2, window_end=timedelta(hours=8), profile=PROFILE)
args[{arg!r}] = {value}
with DAG("bad", schedule=None, start_date=datetime(2026, 1, 1)):
    SpotPriceWindowSensor(task_id="train", **args)
"""
TIMETABLE_DAG = """
args = dict(profile=PROFILE, job_hours=2, start_hour=0, end_hour=8)
args[{arg!r}] = {value}
with DAG("bad", schedule=PriceWindowTimetable(**args), start_date=datetime(2026, 1, 1)):
    pass
"""
GOOD_DAG = """
with DAG("good", schedule=None, start_date=datetime(2026, 1, 1)):
    SpotJobOperator(task_id="train", command=["python", "-c", "print(1)"], checkpoint_uri=CKPT)
"""


def _parse(folder: Path, body: str) -> tuple[dict, dict]:
    """A real DagBag over ``folder`` holding the bad DAG and a good one beside it."""
    from airflow.dag_processing.dagbag import DagBag

    ckpt = (folder / "ckpt").as_uri()
    header = HEADER.format(ckpt=ckpt, profile=PROFILE)
    (folder / "bad_dag.py").write_text(header + textwrap.dedent(body))
    (folder / "good_dag.py").write_text(header + GOOD_DAG)
    bag = DagBag(dag_folder=str(folder))
    return bag.import_errors, bag.dags


def _last_line(trace: str) -> str:
    """The error line Airflow shows for an import error (the exception's message)."""
    return trace.strip().splitlines()[-1]


def _assert_refused(tmp_path: Path, body: str, words: str, *, task: str | None = "train"):
    errors, dags = _parse(tmp_path, body)
    assert "good" in dags and "bad" not in dags, errors  # the good DAG beside it still loads
    [(path, trace)] = errors.items()
    assert path.endswith("bad_dag.py")
    line = _last_line(trace)
    assert line.startswith("ValueError: "), trace
    message = line.removeprefix("ValueError: ")
    if task is not None:
        assert message.startswith(f"{task}: "), message
    assert words in message, message
    assert "Traceback" not in message and len(message) < 600
    # nothing damaged: nothing created beside the DAG files (no checkpoint folder, no cloud)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == [
        "bad_dag.py",
        "good_dag.py",
    ]
    return message


@pytest.mark.parametrize(
    "arg,value,words", OPERATOR_CASES, ids=[f"{a}={v}" for a, v, _ in OPERATOR_CASES]
)
def test_operator_refuses_bad_arguments_at_parse_time(tmp_path, arg, value, words):
    message = _assert_refused(tmp_path, OPERATOR_DAG.format(arg=arg, value=value, base="{}"), words)
    assert arg.split("_")[0] in message or arg in ("deferrable",)


@pytest.mark.parametrize(
    "arg,value,words", EC2_CASES, ids=[f"{a}={v[-40:]}" for a, v, _ in EC2_CASES]
)
def test_operator_on_ec2_refuses_credentials_and_bad_options_at_parse_time(
    tmp_path, arg, value, words
):
    base = "{'provider': 'ec2', 'provider_options': " + EC2 + "}}"
    message = _assert_refused(tmp_path, OPERATOR_DAG.format(arg=arg, value=value, base=base), words)
    assert GITHUB not in message and ":p@" not in message and ":pw@" not in message


@pytest.mark.parametrize(
    "arg,value,words", DECORATOR_CASES, ids=[f"{a}={v}" for a, v, _ in DECORATOR_CASES]
)
def test_task_spot_refuses_bad_arguments_at_parse_time(tmp_path, arg, value, words):
    message = _assert_refused(tmp_path, DECORATOR_DAG.format(arg=arg, value=value), words)
    assert arg in message or arg == "cloud"


@pytest.mark.parametrize(
    "arg,value,words", SENSOR_CASES, ids=[f"{a}={v[:40]}" for a, v, _ in SENSOR_CASES]
)
def test_price_window_sensor_refuses_bad_arguments_at_parse_time(tmp_path, arg, value, words):
    _assert_refused(tmp_path, SENSOR_DAG.format(arg=arg, value=value), words)


@pytest.mark.parametrize(
    "arg,value,words", TIMETABLE_CASES, ids=[f"{a}={v[:40]}" for a, v, _ in TIMETABLE_CASES]
)
def test_price_window_timetable_refuses_bad_arguments_at_parse_time(tmp_path, arg, value, words):
    message = _assert_refused(
        tmp_path, TIMETABLE_DAG.format(arg=arg, value=value), words, task=None
    )
    assert message.startswith("PriceWindowTimetable: "), message


# -- the triggers' kwargs (what the triggerer reads back from its table) ------------------------
def _next(**changes) -> dict:
    record = JobRecord(job_id="j", created_at=1.0e9)
    data = {
        "action": "sleep",
        "record": record.to_dict(),
        "until": 1.0e9 + 5,
        "lease": None,
        "reason": "",
        "failing_since": None,
        "notice_at": None,
    }
    return {**data, **changes}


GOOD_JOB_TRIGGER = dict(
    provider="local",
    provider_options={"url": "http://127.0.0.1:1"},
    next=_next(),
    checkpoint_uri="file:///c",
    controller_options={"poll_interval": 0.5},
)


def _launch(spec=None, **changes) -> dict:
    """A trigger's ``launch`` (``jobs.Relaunch.to_dict()``) for GOOD_JOB_TRIGGER's job."""
    good = {
        "job_id": "j",
        "command": ["python", "train.py"],
        "checkpoint_uri": "file:///c",
        "pools": [Pool("local", "r", "r-a", "t").to_dict()],
        "env": {"EPOCHS": "3"},
    }
    data = {"spec": {**good, **(spec or {})}, "policy_options": {}, "max_user_retries": 3}
    return {**data, **changes}


JOB_TRIGGER_CASES = [
    ("launch", "x", "not a mapping"),
    ("launch", _launch(spec={"job_id": "other"}), "not the watched job"),
    ("launch", _launch(spec={"command": "rm -rf /"}), "command"),
    ("launch", _launch(spec={"pools": [{"zone": "a"}]}), "malformed"),
    ("launch", _launch(policy_options={"max_preemptions": -1}), "max_preemptions"),
    ("launch", _launch(policy_options={"retries": 1}), "unknown policy_options"),
    ("launch", _launch(max_user_retries="many"), "max_user_retries"),
    ("launch", _launch(spec={"env": {"WANDB_API_KEY": "0123456789abcdef"}}), "credentials"),
    ("provider", "gcp", "not installed"),
    ("provider_options", "x", "mapping"),
    ("provider_options", {"token": "x"}, "credential"),
    ("checkpoint_uri", "file://host/x", "names host"),
    ("controller_options", {"poll_interval": NAN}, "poll_interval"),
    ("controller_options", {"poll_interval": INF}, "poll_interval"),
    ("controller_options", {"poll_interval": 0}, "poll_interval"),
    ("controller_options", {"poll_interval": "soon"}, "poll_interval"),
    ("controller_options", {"heartbeat_timeout": -1}, "heartbeat_timeout"),
    ("controller_options", {"poll": 1}, "unknown controller_options"),
    ("return_on_notice", "no", "return_on_notice"),
    ("not_before", NAN, "not_before"),
    ("not_before", "soon", "not_before"),
    ("next", _next(action="explode"), "action"),
    ("next", _next(action="finished"), "watches"),
    ("next", _next(until=NAN), "until"),
    ("next", _next(record={"schema_version": 99}), "schema_version 99"),
    ("next", _next(record={**_next()["record"], "created_at": NAN}), "created_at"),
    ("next", {"action": "sleep"}, "malformed"),
    ("next", [], "malformed"),
]


@pytest.mark.parametrize(
    "arg,value,words",
    JOB_TRIGGER_CASES,
    ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(JOB_TRIGGER_CASES)],
)
def test_spot_job_trigger_refuses_bad_kwargs_in_one_line(arg, value, words):
    SpotJobTrigger(**GOOD_JOB_TRIGGER)  # the good kwargs construct
    SpotJobTrigger(**GOOD_JOB_TRIGGER, launch=_launch())
    with pytest.raises(ValueError) as info:
        SpotJobTrigger(**{**GOOD_JOB_TRIGGER, arg: value})
    message = str(info.value)
    assert message.startswith("SpotJobTrigger: ") and words in message, message
    assert "\n" not in message


GOOD_WINDOW_TRIGGER = dict(
    provider="local",
    provider_options={},
    zones=None,
    profile=None,
    job_hours=2.0,
    window_start=1.0e9,
    window_end=1.0e9 + 8 * 3600,
    max_price=0.5,
    poll_interval=30.0,
)
WINDOW_TRIGGER_CASES = [
    ("job_hours", NAN),
    ("job_hours", -1),
    ("job_hours", "2"),
    ("window_start", INF),
    ("window_end", NAN),
    ("window_end", 1.0e9 - 1),
    ("max_price", NAN),
    ("max_price", 0),
    ("poll_interval", INF),
    ("poll_interval", 0),
    ("provider", "azure"),
    ("zones", "us-east-2a"),
    ("profile", {"zone_prices": {}}),
    ("provider_options", {"password": "x"}),
]


@pytest.mark.parametrize(
    "arg,value",
    WINDOW_TRIGGER_CASES,
    ids=[f"{a}-{i}" for i, (a, _) in enumerate(WINDOW_TRIGGER_CASES)],
)
def test_price_window_trigger_refuses_bad_kwargs_in_one_line(arg, value):
    SpotPriceWindowTrigger(**GOOD_WINDOW_TRIGGER)
    with pytest.raises(ValueError) as info:
        SpotPriceWindowTrigger(**{**GOOD_WINDOW_TRIGGER, arg: value})
    message = str(info.value)
    assert message.startswith("SpotPriceWindowTrigger: ") and "\n" not in message
    assert arg.split("_")[0] in message or "provider" in message, message


# -- run time: templates as rendered, zones the provider lacks ---------------------------------
def _operator(**kwargs) -> SpotJobOperator:
    with DAG(
        "bad_at_run",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        params={"uri": "file:///tmp/x", "image": "img", "zone": "us-east-2a"},
    ):
        return SpotJobOperator(
            task_id="train", command=["python", "-c", "print(1)"], deferrable=False, **kwargs
        )


RENDERED_CASES = [
    ({"checkpoint_uri": "{{ params.uri }}"}, {"uri": "file://host/x"}, "names host"),
    ({"checkpoint_uri": "{{ params.uri }}"}, {"uri": "ftp://x/y"}, "unsupported scheme"),
    ({"checkpoint_uri": "{{ params.uri }}"}, {"uri": ""}, "checkpoint_uri"),
    ({"image": "{{ params.image }}"}, {"image": "--privileged"}, "leading '-'"),
    ({"provider_options": {"url": "{{ params.uri }}"}}, {"uri": "http://u:p@h:1"}, "password"),
    (
        {
            "env": {"DB": "{{ params.uri }}"},
            "provider": "ec2",
            "provider_options": {
                "region": "us-east-1",
                "subnets": ["s"],
                "image_id": "ami-1",
                "instance_types": ["g5.xlarge"],
            },
        },
        {"uri": "postgres://u:p@db/x"},
        "DB (holds a URL with a password)",
    ),
]


@pytest.mark.parametrize(
    "kwargs,params,words", RENDERED_CASES, ids=[w for _, _, w in RENDERED_CASES]
)
def test_templated_values_that_render_bad_fail_the_task_in_one_line(
    tmp_path, kwargs, params, words
):
    kwargs = {"checkpoint_uri": (tmp_path / "ckpt").as_uri(), **kwargs}
    op = _operator(**kwargs)  # parses: a template is checked once rendered
    store, ti = StateStore(), TI()
    context = {"params": params, "task_state_store": store, "ti": ti, "run_id": "r"}
    op.render_template_fields(context)  # Airflow's own Jinja rendering
    with pytest.raises(AirflowFailException) as info:
        op.execute(context)
    message = str(info.value)
    assert message.startswith("train: ") and words in message and "\n" not in message
    assert ":p@" not in message  # the credential is named, never shown
    assert store.data == {} and list(tmp_path.iterdir()) == []  # nothing written, nothing made


def test_zones_the_provider_lacks_fail_the_task_in_one_line_naming_its_zones(tmp_path):
    from airflow_spot.hooks.spot import SpotHook

    op = _operator(checkpoint_uri=(tmp_path / "ckpt").as_uri(), zones=["us-east-2a", "mars-1a"])
    store, ti = StateStore(), TI()
    try:
        with pytest.raises(AirflowFailException) as info:
            op.execute({"task_state_store": store, "ti": ti})
        zones = sorted({p.zone for p in SpotHook("local", {}).pools()})
    finally:
        SpotHook("local", {}).close()  # the in-process cloud this test opened
    message = str(info.value)
    assert message.startswith("train: ") and "mars-1a" in message and "\n" not in message
    assert "us-east-2a" in zones and all(z in message for z in zones)
    assert not (tmp_path / "ckpt").exists()  # nothing launched, no store made


# -- records read back -------------------------------------------------------------------------
def _good_record() -> dict:
    pool = Pool("aws", "us-east-2", "us-east-2a", "p3.2xlarge")
    from spot_core.model import Attempt, Outcome

    record = JobRecord(job_id="j", created_at=1.0e9).start_attempt(
        Attempt(number=1, pool=pool, started_at=1.0e9, lease_id="i-1")
    )
    record = record.finish_attempt(
        Attempt(
            number=1,
            pool=pool,
            started_at=1.0e9,
            lease_id="i-1",
            ended_at=1.0e9 + 60,
            outcome=Outcome.PREEMPTED,
            cost=0.1,
            on_demand_cost=0.3,
        )
    )
    return record.to_dict()


def _corrupt(kind: str):
    data = _good_record()
    if kind == "newer schema":
        return {**data, "schema_version": 2}
    if kind == "no schema":
        return {k: v for k, v in data.items() if k != "schema_version"}
    if kind == "truncated":
        return {k: data[k] for k in list(data)[:4]}
    if kind == "NaN cost":
        data["attempts"][0]["cost"] = NAN
        return data
    if kind == "Infinity created_at":
        return {**data, "created_at": INF}
    if kind == "string counter":
        return {**data, "preemptions": "1"}
    if kind == "bool counter":
        return {**data, "preemptions": True}
    if kind == "foreign attempt field":
        data["attempts"][0]["gpu"] = "a100"
        return data
    if kind == "attempts not a list":
        return {**data, "attempts": 5}
    if kind == "ledger NaN":
        return {**data, "ledger": {**data["ledger"], "spent": NAN}}
    if kind == "bad outcome":
        data["attempts"][0]["outcome"] = "vanished"
        return data
    if kind == "a string":
        return '{"schema_version": 1, "job_id"'
    if kind == "a list":
        return [data]
    raise AssertionError(kind)


CORRUPT = [
    "newer schema",
    "no schema",
    "truncated",
    "NaN cost",
    "Infinity created_at",
    "string counter",
    "bool counter",
    "foreign attempt field",
    "attempts not a list",
    "ledger NaN",
    "bad outcome",
    "a string",
    "a list",
]


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_corrupt_record_in_the_task_state_store_is_one_clear_error_and_left_alone(tmp_path, kind):
    op = _operator(
        checkpoint_uri=(tmp_path / "ckpt").as_uri(), provider_options={"url": "http://127.0.0.1:1"}
    )  # never reached
    store, ti = StateStore(), TI()
    store.data[RECORD_KEY] = bad = _corrupt(kind)
    with pytest.raises(AirflowFailException) as info:  # no retry: a retry reads the same
        op.execute({"task_state_store": store, "ti": ti})
    message = str(info.value)
    assert (
        message.startswith("train: the JobRecord in the task state store")
        and "\n" not in message
        and "delete the key" in message
        and RECORD_KEY in message
    )
    if kind == "newer schema":
        assert "schema_version 2" in message and "Upgrade spot-pipelines" in message
    assert store.data[RECORD_KEY] is bad and ti.xcom == {}  # left as it was
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("kind", ["newer schema", "NaN cost", "truncated"])
def test_a_corrupt_record_for_task_spot_is_one_clear_error_and_left_alone(tmp_path, kind):
    from airflow.sdk import task

    with DAG("bad_record", schedule=None, start_date=datetime(2026, 1, 1)):
        op = task.spot(
            task_id="train", checkpoint_uri=(tmp_path / "ckpt").as_uri(), cloud="signal"
        )(lambda: 1)().operator
    store, ti = StateStore(), TI()
    ti.try_number = 1
    store.data["spot_task_record"] = bad = _corrupt(kind)
    with pytest.raises(AirflowFailException) as info:
        op.execute({"task_state_store": store, "ti": ti})
    message = str(info.value)
    assert (
        message.startswith("train: the JobRecord in the task state store") and "\n" not in message
    )
    assert store.data["spot_task_record"] is bad and not (tmp_path / "ckpt").exists()


EVENTS = {
    "not a mapping": "done",
    "unknown status": {"status": "great", "next": _next()},
    "no next": {"status": "ended"},
    "next not a mapping": {"status": "ended", "next": "x"},
    "newer record": {
        "status": "ended",
        "next": _next(record={**_good_record(), "schema_version": 7}),
    },
    "NaN in record": {
        "status": "wake",
        "next": _next(record={**_good_record(), "created_at": NAN}),
    },
    "truncated next": {"status": "notice", "next": {"action": "watch"}},
}


@pytest.mark.parametrize("kind", list(EVENTS))
def test_a_corrupt_trigger_event_is_one_line_and_the_stored_record_is_kept(tmp_path, kind):
    op = _operator(
        checkpoint_uri=(tmp_path / "ckpt").as_uri(), provider_options={"url": "http://127.0.0.1:1"}
    )
    store, ti = StateStore(), TI()
    store.data[RECORD_KEY] = good = _good_record()
    with pytest.raises(AirflowException) as info:  # a retry resumes from the kept record
        op.execute_complete({"task_state_store": store, "ti": ti}, EVENTS[kind])
    message = str(info.value)
    assert message.startswith("train: ") and "task state store" in message
    assert "\n" not in message and len(message) < 600
    assert store.data[RECORD_KEY] is good and JobRecord.from_dict(good).preemptions == 1
    assert math.isfinite(JobRecord.from_dict(store.data[RECORD_KEY]).created_at)
