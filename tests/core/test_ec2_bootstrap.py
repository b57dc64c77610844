"""EC2 user-data installs a pinned spot-pipelines at boot when the machine image lacks it.

Against moto and the instance runtime emulator (which runs user-data as a local process):
the wheel built from this repository is put in S3, the instance's user-data fetches it
with the instance's own credentials and installs it into the image's Python (an
environment that has the libraries but not spot-pipelines), and the training step, the
watcher and the status report all run from that install. Bad ``bootstrap`` options fail
when the options are checked, in one line.
"""

from __future__ import annotations

import base64
import subprocess

import pytest

from spot_core.controller import Controller, JobSpec, classify
from spot_core.errors import ConfigError
from spot_core.model import Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import check_provider
from spot_core.providers.base import LaunchSpec, LeaseState
from spot_core.providers.ec2 import Ec2Provider
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import client, make_network, managed_live_instances, unique
from tests.support.dist_helpers import clean_venv, locked_requirements, uv_install

pytestmark = pytest.mark.timeout(180)
WHEEL_URI = "s3://artifacts/dist/spot_pipelines-0.1.0-py3-none-any.whl"


@pytest.fixture(scope="module")
def image_requirements(tmp_path_factory):
    return locked_requirements(tmp_path_factory.mktemp("lock"), "aws")


@pytest.fixture
def image_python(image_requirements, tmp_path_factory):
    """A fresh machine image's Python: the locked core and aws libraries (from uv's cache),
    no spot-pipelines."""
    root = tmp_path_factory.mktemp("image")
    python = clean_venv(root / "python", seed=True)  # seeded: the bootstrap runs its pip
    uv_install(python, "--requirement", str(image_requirements))
    missing = subprocess.run([python, "-c", "import spot_core"], capture_output=True, cwd=root)
    assert missing.returncode != 0, "the image must not have spot-pipelines yet"
    return python


@pytest.fixture
def net(aws_env):
    network = make_network(aws_env)
    yield network
    assert managed_live_instances(aws_env) == [], "orphans left"


def _provider(endpoint, net, bootstrap) -> Ec2Provider:
    # No agent_python or watch_command: the defaults resolve on the bootstrapped PATH.
    return Ec2Provider.from_options(
        region="us-east-1",
        endpoint_url=endpoint,
        subnets=net["subnets"],
        instance_types=["g5.xlarge"],
        image_id=net["image_id"],
        instance_profile=net["instance_profile"],
        watch_poll_interval=0.1,
        bootstrap=bootstrap,
    )


def _runtime(endpoint, tmp_path):
    return Ec2InstanceRuntime(
        endpoint, tmp_path / "runtime", ("us-east-1",), default_instance_env(endpoint, "us-east-1")
    )


def _user_data(endpoint, instance_id) -> str:
    raw = client("ec2", endpoint).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData"
    )
    return base64.b64decode(raw["UserData"]["Value"]).decode()


@pytest.mark.parametrize("source", ["wheel", "pip"])
def test_spot_pipelines_is_installed_at_boot_and_the_step_runs_from_it(
    aws_env, net, built_dist, image_python, tmp_path, source
):
    """``wheel``: from S3 with the instance's credentials. ``pip``: a pinned requirement
    resolved by pip against an index (here a find-links folder holding the built wheel)."""
    _, wheel = built_dist
    bucket = unique("artifacts")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    client("s3", aws_env).upload_file(str(wheel), bucket, f"dist/{wheel.name}")
    # The image has the dependencies (--no-deps: quick).
    bootstrap = {
        "wheel": f"s3://{bucket}/dist/{wheel.name}",
        "python": str(image_python),
        "pip_args": ["--no-deps"],
    }
    pinned = f"spot-pipelines[aws]=={wheel.name.split('-')[1]}"
    if source == "pip":
        bootstrap = {
            "pip": pinned,
            "python": str(image_python),
            "pip_args": ["--no-deps", "--no-index", "--find-links", str(wheel.parent)],
        }
    step = (
        "bash",
        "-c",
        "python3 -c 'import spot_core, sys; print(\"step-python\", sys.prefix)' "
        "&& python3 -m spot_core.workloads.softmax_regression --steps 40 --step-seconds 0 "
        "--checkpoint-every-steps 10",
    )
    with _provider(aws_env, net, bootstrap) as provider, _runtime(aws_env, tmp_path):
        spec = JobSpec(
            job_id=unique("job-boot"),
            command=step,
            checkpoint_uri=f"s3://{bucket}/ckpt",
            pools=provider.pools()[:1],
        )
        controller = Controller(
            provider,
            provider.market,
            RetryPolicy(max_infrastructure_retries=0),
            poll_interval_seconds=0.2,
        )
        record = controller.run(spec)
    [attempt] = record.attempts
    assert record.status == "succeeded", attempt.message
    script = _user_data(aws_env, attempt.lease_id)
    assert (bootstrap.get("wheel") or f"'{pinned}'") in script
    for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "testing"):
        assert secret not in script
    log = (tmp_path / "runtime" / f"{attempt.lease_id}.log").read_text()
    image_env = image_python.parent.parent
    assert f"step-python {image_env}" in log, log[-2000:]
    installed = subprocess.run(
        [image_python, "-c", "import spot_core; print(spot_core.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert installed.startswith(str(image_env)), "installed into the image's environment"


def test_a_failed_bootstrap_powers_the_instance_off_and_says_why(
    aws_env, net, image_python, tmp_path
):
    bucket = unique("artifacts")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    bootstrap = {
        "wheel": f"s3://{bucket}/dist/spot_pipelines-9.9.9-py3-none-any.whl",
        "python": str(image_python),
        "timeout_seconds": 60,
    }
    spec = LaunchSpec(
        job_id=unique("job-noboot"),
        attempt=1,
        command=("true",),
        checkpoint_uri=f"s3://{bucket}/ckpt",
        env={},
    )
    with _provider(aws_env, net, bootstrap) as provider, _runtime(aws_env, tmp_path) as runtime:
        lease = provider.launch(spec, provider.pools()[0])
        assert runtime.wait_for(
            lambda rt: lease.lease_id in rt.instances and rt.instances[lease.lease_id].done,
            timeout=60,
        )
        status = provider.observe([lease])[lease.lease_id]
    assert status.state is LeaseState.TERMINATED and "without a status report" in status.message
    assert classify(status) is Outcome.INFRASTRUCTURE_FAILED, "retried on new capacity"
    console = (tmp_path / "runtime" / f"{lease.lease_id}.log").read_text()
    assert "spot-pipelines bootstrap failed" in console
    assert "404" in (tmp_path / "runtime" / f"{lease.lease_id}.bootstrap.log").read_text()


def test_a_pinned_requirement_goes_into_a_new_venv_on_the_path(aws_env, net):
    bootstrap = {
        "pip": "spot-pipelines[aws]==0.1.0",
        "pip_args": ["--index-url", "https://pypi.example.com/simple"],
    }
    with _provider(aws_env, net, bootstrap) as provider:
        lease = provider.launch(
            LaunchSpec(
                job_id=unique("job-pip"),
                attempt=1,
                command=("python3", "train.py"),
                checkpoint_uri="s3://b/ckpt",
                env={},
            ),
            provider.pools()[0],
        )
        script = _user_data(aws_env, lease.lease_id)
    assert "python3 -m venv --system-site-packages /opt/spot-pipelines" in script
    assert (
        "/opt/spot-pipelines/bin/python -m pip install --quiet --disable-pip-version-check "
        "--index-url https://pypi.example.com/simple 'spot-pipelines[aws]==0.1.0'"
    ) in script
    assert "timeout 900 bash -c spot_bootstrap" in script
    assert script.index('export PATH=/opt/spot-pipelines/bin:"$PATH"') < script.index(
        "spot-pipelines watch"
    ), "the installed package runs the step"
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


GOOD = {
    "region": "us-east-1",
    "subnets": ["subnet-1"],
    "image_id": "ami-1",
    "instance_types": ["g5.xlarge"],
}


@pytest.mark.parametrize(
    "bootstrap, says",
    [
        ("spot-pipelines==0.1.0", "must be a mapping"),
        ({}, "exactly one of 'pip' or 'wheel'"),
        ({"pip": "spot-pipelines==0.1.0", "wheel": WHEEL_URI}, "exactly one of 'pip' or 'wheel'"),
        ({"pip": "spot-pipelines"}, "must pin spot-pipelines"),
        ({"pip": "torch==2.13.0"}, "must pin spot-pipelines"),
        ({"wheel": "https://example.com/spot_pipelines-0.1.0-py3-none-any.whl"}, "s3:// URI"),
        ({"wheel": "s3://bucket/dist/spot-pipelines.tar.gz"}, "must name a wheel file"),
        (
            {"wheel": "s3://b/x\nreboot\n/spot_pipelines-0.1.0-py3-none-any.whl"},
            "control characters",
        ),
        ({"pip": 3}, "must pin spot-pipelines"),
        ({"wheel": None}, "wheel is null"),
        ({"pip": "spot-pipelines==0.1.0", "venv": None}, "venv is null"),
        ({"wheel": WHEEL_URI, "python": None}, "python is null"),
        ({"wheel": WHEEL_URI, "venv": "venv"}, "absolute path"),
        ({"wheel": WHEEL_URI, "venv": "/opt/a", "python": "/usr/bin/python3"}, "not both"),
        ({"wheel": WHEEL_URI, "pip_args": "--no-deps"}, "list of pip arguments"),
        ({"wheel": WHEEL_URI, "timeout_seconds": 0}, "seconds > 0"),
        ({"wheel": WHEEL_URI, "upgrade": True}, "unknown bootstrap key"),
        (
            {
                "pip": "spot-pipelines==0.1.0",
                "pip_args": ["--index-url", "https://me:hunter2@pypi.example.com/simple"],
            },
            "a URL with a password",
        ),
    ],
)
def test_bad_bootstrap_options_fail_when_checked_in_one_line(bootstrap, says):
    with pytest.raises(ConfigError, match=says) as caught:
        check_provider("ec2", {**GOOD, "bootstrap": bootstrap})
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)
    with pytest.raises(ConfigError, match=says):
        from spot_core.providers.ec2 import Ec2Options

        Ec2Options.from_plain(**{**GOOD, "bootstrap": bootstrap})


def test_good_bootstrap_options_pass_and_templates_wait_for_rendering():
    check_provider("ec2", {**GOOD, "bootstrap": {"wheel": WHEEL_URI}})
    check_provider(
        "ec2",
        {
            **GOOD,
            "bootstrap": {
                "pip": "spot-pipelines[aws,kubernetes]==0.1.0",
                "python": "/opt/conda/bin/python",
                "system_site_packages": False,
            },
        },
    )
    check_provider("ec2", {**GOOD, "bootstrap": {"wheel": "s3://b/{{ var.value.wheel }}"}})
