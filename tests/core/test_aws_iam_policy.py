"""docs/aws-iam-policy.json lists exactly the AWS actions the code calls.

The code's boto3 calls are found by reading it: every attribute or paginator name in the
AWS modules that is an operation of EC2, S3 or SQS (botocore's own service models say
which names are operations). Each operation maps to its IAM action; a few actions are
required by AWS for a call without being calls themselves (tagging and passing a role at
launch). The controller policy must equal that set; the instance policy must equal what
the on-instance side calls (the S3 store, and the one EC2 call a lease makes: tagging its
own instance with its call key, which no other instance may do).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

botocore = pytest.importorskip("botocore.session")

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_MODULES = [
    *sorted(str(f.relative_to(REPO)) for f in (REPO / "spot_core/providers/ec2").glob("*.py")),
    "spot_core/adaptors/aws.py",
    "spot_core/providers/ec2_agent.py",
    "spot_core/market/ec2.py",
    "spot_core/interruption/eventbridge.py",
    "spot_core/checkpoint/s3_backend.py",
]
INSTANCE_MODULES = ["spot_core/checkpoint/s3_backend.py", "spot_core/providers/ec2_agent.py"]
S3_ACTIONS = {
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObjects": "s3:DeleteObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListObjectsV2": "s3:ListBucket",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
}
SQS_ACTIONS = {"ReceiveMessage": "sqs:ReceiveMessage", "DeleteMessageBatch": "sqs:DeleteMessage"}
IMPLIED = {
    "ec2:RunInstances": {"ec2:CreateTags", "iam:PassRole"},
    "ec2:CreateFleet": {"ec2:CreateTags", "iam:PassRole", "iam:CreateServiceLinkedRole"},
}


def _operations() -> dict[str, set[str]]:
    """snake_case operation name -> IAM actions, over the services the code uses."""
    from botocore import xform_name

    session = botocore.get_session()
    table: dict[str, set[str]] = {}
    for service, special in (("ec2", None), ("s3", S3_ACTIONS), ("sqs", SQS_ACTIONS)):
        for name in session.get_service_model(service).operation_names:
            if special is None:
                action = f"{service}:{name}"
            else:  # an unmapped S3/SQS call shows up as such, and fails the comparison
                action = special.get(name, f"UNMAPPED {service}:{name}")
            table.setdefault(xform_name(name), set()).add(action)
    return table


def _called(modules: list[str]) -> set[str]:
    operations = _operations()
    found: set[str] = set()
    for module in modules:
        tree = ast.parse((REPO / module).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Attribute):
                names.append(node.attr)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.append(node.value)  # get_paginator("describe_instances")
            for name in names:
                found |= operations.get(name, set())
    for action in list(found):
        found |= IMPLIED.get(action, set())
    return found


def _policy_actions(policy: dict) -> set[str]:
    actions: set[str] = set()
    for statement in policy["Statement"]:
        value = statement["Action"]
        actions |= {value} if isinstance(value, str) else set(value)
    return actions


@pytest.fixture(scope="module")
def document() -> dict:
    return json.loads((REPO / "docs" / "aws-iam-policy.json").read_text())


def test_controller_policy_is_exactly_what_the_code_calls(document):
    called = _called(CONTROLLER_MODULES)
    assert {"ec2:RunInstances", "ec2:DescribeInstances", "s3:PutObject"} <= called
    assert _policy_actions(document["ControllerPolicy"]) == called


def test_instance_policy_is_exactly_what_the_step_side_calls(document):
    called = _called(INSTANCE_MODULES)
    assert {a for a in called if a.startswith("ec2:")} == {"ec2:CreateTags"}
    assert _policy_actions(document["InstancePolicy"]) == called


def test_an_instance_may_tag_only_itself_and_only_with_its_call_key(document):
    """The lease publishes its public key on its own instance (prefect_spot._remote); if a
    node could tag another instance, another job's node could forge this call's result."""
    [statement] = [
        s for s in document["InstancePolicy"]["Statement"] if s["Action"] == "ec2:CreateTags"
    ]
    assert statement["Resource"] == "arn:aws:ec2:*:ACCOUNT:instance/*"
    assert statement["Condition"]["ArnEquals"] == {
        "ec2:SourceInstanceARN": "arn:aws:ec2:*:ACCOUNT:instance/${ec2:InstanceID}"
    }
    assert statement["Condition"]["ForAllValues:StringEquals"] == {
        "aws:TagKeys": ["spot-pipelines/call-pubkey"]
    }


def test_terminate_is_scoped_to_managed_instances(document):
    [statement] = [
        s
        for s in document["ControllerPolicy"]["Statement"]
        if s["Action"] == "ec2:TerminateInstances"
    ]
    assert statement["Condition"]["StringEquals"] == {
        "aws:ResourceTag/spot-pipelines:managed": "true"
    }


def test_the_instance_policy_reaches_only_the_checkpoint_prefix(document):
    """A node may touch objects under PREFIX/ only (docs/aws.md, "Scoping the instance
    policy per job"): no bucket-wide or account-wide resource, listing only by prefix."""
    for statement in document["InstancePolicy"]["Statement"]:
        if statement["Action"] == "ec2:CreateTags":
            continue  # its own instance only: test_an_instance_may_tag_only_itself...
        resources = statement["Resource"]
        resources = [resources] if isinstance(resources, str) else resources
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else actions
        if any(a.startswith("s3:List") for a in actions):
            assert resources == ["arn:aws:s3:::BUCKET"]
            assert statement["Condition"]["StringLike"]["s3:prefix"] == ["PREFIX/*"]
        else:
            assert all(r.startswith("arn:aws:s3:::BUCKET/PREFIX/") for r in resources), resources
