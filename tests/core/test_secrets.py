"""Secrets never reach EC2 user-data, judged by name and by value; image names cannot
inject `docker run` flags.

User-data is readable by anyone with ec2:DescribeInstanceAttribute, so the provider
refuses a launch whose environment holds a credential, in one line that names the
variable and the fix and never echoes the value. The EC2 cases run the real provider
against moto in server mode and check what moto recorded: no instance was started.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from spot_core import container
from spot_core.credentials import credential_findings
from spot_core.errors import ConfigError
from spot_core.providers.base import LaunchSpec
from spot_core.providers.ec2 import Ec2Provider
from tests.support.aws_helpers import client, make_network, managed_live_instances, unique

pytestmark = pytest.mark.timeout(120)

# name, value, what the refusal must say about it
CREDENTIALS = [
    ("DATABASE_URL", "postgres://svc:hunter2@db.internal:5432/prod", "URL with a password"),
    ("BROKER", "amqp://guest:guest@mq:5672//", "URL with a password"),
    (
        "TLS_MATERIAL",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----",
        "PEM block",
    ),
    ("REPO_ACCESS", "ghp_" + "a1B2" * 9, "GitHub token"),
    ("GH", "github_pat_11ABCDEFG0" + "x" * 40, "GitHub token"),
    ("LLM", "sk-proj-" + "Z9y8" * 10, "OpenAI-style secret key"),
    ("NOTIFY", "https://hooks.slack.com/services/T000/B000/XXXXXXXX", "Slack webhook"),
    ("AWS_KEY_ID_COPY", "AKIA" + "ABCDEFGHIJKLMNOP", "its name"),
    ("UPLOAD_ID", "AKIA" + "ABCDEFGHIJKLMNOP", "AWS access key id"),
    ("GITHUB_PAT", "anything", "its name"),
    ("OPENAI_KEY", "anything", "its name"),
    ("SLACK_WEBHOOK_URL", "anything", "its name"),
    ("SENTRY_DSN", "anything", "its name"),
    ("HF_TOKEN", "anything", "its name"),
]
HARMLESS = {
    "WANDB_MODE": "offline",
    "DATA": "s3://bucket/train/",
    "PATH": "/usr/bin:/bin",
    "MODEL_REPO": "https://huggingface.co/acme/model",
    "PATTERN": "*.parquet",
    "MONKEY": "patch",
    "GIT_URL": "https://github.com/acme/repo.git",
    "SKETCH": "sk-short",
    "PROXY": "http://proxy.internal:3128",
}


@pytest.mark.parametrize("name,value,why", CREDENTIALS, ids=[c[0] for c in CREDENTIALS])
def test_a_credential_by_name_or_value_is_found(name, value, why):
    found = credential_findings({**HARMLESS, name: value})
    assert list(found) == [name] and why in found[name]
    assert value not in found[name]


def test_ordinary_variables_are_not_credentials():
    assert credential_findings(HARMLESS) == {}


@pytest.fixture
def net(aws_env):
    bucket = unique("ckpt")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    network = make_network(aws_env)
    yield {**network, "bucket": bucket}
    assert managed_live_instances(aws_env, ("us-east-1",)) == [], "nothing was launched"


def _provider(endpoint, net) -> Ec2Provider:
    return Ec2Provider.from_options(
        region="us-east-1",
        endpoint_url=endpoint,
        subnets=net["subnets"],
        instance_types=["g4dn.xlarge"],
        image_id=net["image_id"],
        instance_profile=net["instance_profile"],
        agent_python=sys.executable,
    )


def _spec(net, env=None, image=None) -> LaunchSpec:
    spec = LaunchSpec(
        job_id="job-s",
        attempt=1,
        command=("python", "train.py"),
        checkpoint_uri=f"s3://{net['bucket']}/job-s",
        env=env or {},
    )
    return dataclasses.replace(spec, image=image) if image else spec


def test_the_ec2_provider_refuses_every_credential_in_one_line(aws_env, net):
    with _provider(aws_env, net) as provider:
        pool = provider.pools()[0]
        for name, value, why in CREDENTIALS:
            with pytest.raises(ConfigError) as caught:
                provider.launch(_spec(net, {**HARMLESS, name: value}), pool)
            message = str(caught.value)
            assert "\n" not in message and name in message and why in message
            assert value not in message and "instance profile" in message
            for harmless in HARMLESS:
                assert f"{harmless} (" not in message


@pytest.mark.parametrize(
    "image",
    ["-v/:/host", "--privileged", "alpine --privileged", "alpine\n--rm", "alpine\x00", "\tubuntu"],
)
def test_an_image_name_that_could_inject_flags_is_refused(image, aws_env, net):
    with pytest.raises(ConfigError, match="not an image reference"):
        container.wrap(image, ("true",), ())
    with pytest.raises(ConfigError, match="not an image reference"):
        container.docker_argv(image, ["true"], {})
    with _provider(aws_env, net) as provider, pytest.raises(ConfigError, match="image"):
        provider.launch(_spec(net, image=image), provider.pools()[0])


@pytest.mark.parametrize("image", ["-v/:/host", "--privileged"])
def test_the_container_shim_refuses_a_flag_for_an_image_in_one_line(image):
    done = subprocess.run(
        [sys.executable, "-m", "spot_core.container", f"--image={image}", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not an image reference" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr


def test_an_ordinary_image_is_passed_after_the_flags():
    argv = container.docker_argv("ghcr.io/acme/train:1.4", ["python", "t.py"], {})
    assert argv[-3:] == ["ghcr.io/acme/train:1.4", "python", "t.py"]
