"""The describe answer cut before botocore parses it: the scan reads what the tree read."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.parsers import create_parser

from spot_core.providers import ec2_lean

NS = "http://ec2.amazonaws.com/doc/2016-11-15"


def _instance(
    i: int, state: str = "running", reason: str = "<stateReason/>", spot: str = ""
) -> str:
    # Every kept name also appears as a look-alike deeper down (a tag value, a nested
    # item) the way EC2 writes them: escaped text or other element names.
    return (
        f"<item><architecture>x86_64</architecture><blockDeviceMapping><item>"
        f"<deviceName>/dev/sda1</deviceName><ebs><status>attached</status></ebs></item>"
        f"</blockDeviceMapping><instanceId>i-{i:017x}</instanceId>"
        f"<networkInterfaceSet><item><attachment><status>attached</status></attachment>"
        f"<privateIpAddressesSet><item><primary>true</primary></item>"
        f"</privateIpAddressesSet></item></networkInterfaceSet>{reason}"
        f"<tagSet><item><key>Name</key><value>&lt;instanceId&gt;x&lt;/instanceId&gt;"
        f"</value></item><item><key>empty</key><value/></item></tagSet>{spot}"
        f"<groupSet/><instanceState><code>16</code><name>{state}</name></instanceState>"
        f"<metadataOptions><state>applied</state></metadataOptions></item>"
    )


def _answer(reservations: list[list[str]], token: str = "") -> bytes:
    body = "".join(
        f"<item><reservationId>r-{n}</reservationId><ownerId>1</ownerId><groupSet/>"
        + ("<instancesSet/>" if not items else f"<instancesSet>{''.join(items)}</instancesSet>")
        + "</item>"
        for n, items in enumerate(reservations)
    )
    token = f"<nextToken>{token}</nextToken>" if token else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeInstancesResponse xmlns="{NS}">'
        f"<requestId>req</requestId><reservationSet>{body}</reservationSet>{token}"
        f"</DescribeInstancesResponse>"
    ).encode()


def _parsed(body: bytes, operation: str = "DescribeInstances") -> dict:
    model = botocore.session.get_session().get_service_model("ec2").operation_model(operation)
    parsed = create_parser("ec2").parse(
        {"body": body, "headers": {}, "status_code": 200}, model.output_shape
    )
    parsed.pop("ResponseMetadata", None)
    return parsed


ANSWER = _answer(
    [
        [
            _instance(1),
            _instance(
                2,
                "stopping",
                "<stateReason><code>Client.UserInitiatedShutdown"
                "</code><message>a &amp; b &lt;c&gt;</message>"
                "</stateReason>",
                "<spotInstanceRequestId>sir-2</spotInstanceRequestId>",
            ),
        ],
        [],
        [
            _instance(
                3,
                "terminated",
                "<stateReason><code>Server.SpotInstanceTermination</code><message/></stateReason>",
            )
        ],
    ],
    token="next-page",
)


def test_the_scan_reads_exactly_what_the_tree_cut_and_the_full_parse_read():
    keep = ec2_lean.KEPT["DescribeInstances"]
    scanned = ec2_lean.scan_cut(ANSWER, *keep)
    assert scanned is not None and len(scanned) < len(ANSWER) / 2
    assert _parsed(scanned) == _parsed(ec2_lean.tree_cut(ANSWER, *keep))
    full = _parsed(ANSWER)
    lean = _parsed(scanned)
    assert lean["NextToken"] == full["NextToken"] == "next-page"
    for lean_r, full_r in zip(lean["Reservations"], full["Reservations"], strict=True):
        for lean_i, full_i in zip(lean_r["Instances"], full_r["Instances"], strict=True):
            assert lean_i == {
                k: full_i[k]
                for k in ("InstanceId", "State", "StateReason", "SpotInstanceRequestId")
                if k in full_i
            }
    assert lean["Reservations"][0]["Instances"][1]["StateReason"]["Message"] == "a & b <c>"


@pytest.mark.parametrize(
    "odd",
    [
        ANSWER.replace(b'xmlns="', b'xmlns:e="%s" xmlns="' % NS.encode(), 1).replace(
            b"<groupSet/>", b"<e:groupSet/>", 1
        ),  # a prefix
        ANSWER.replace(b"<item><architecture>", b'<item xml:lang="en"><architecture>', 1),
        ANSWER.replace(b"</instancesSet>", b"", 1),  # unbalanced
        ANSWER.replace(b"<value/>", b"<value><![CDATA[<item>]]></value>", 1),
        ANSWER.replace(b"<groupSet/>", b"<!-- <item> -->", 1),
    ],
)
def test_an_answer_the_scan_does_not_recognise_is_cut_through_the_tree(odd):
    keep = ec2_lean.KEPT["DescribeInstances"]
    try:
        expected = ec2_lean.tree_cut(odd, *keep)
    except Exception:  # noqa: BLE001 - malformed: cut() raises as the tree does
        with pytest.raises(Exception):  # noqa: B017 - whatever the tree's cut raised
            ec2_lean.cut(odd, *keep)
        return
    assert ec2_lean.cut(odd, *keep) == expected


@pytest.mark.parametrize(
    "operation,shape",
    [("DescribeInstances", "Instance"), ("DescribeSpotInstanceRequests", "SpotInstanceRequest")],
)
def test_kept_names_occur_only_in_the_item_itself_in_botocores_model(operation, shape):
    """What makes the scan sound: if botocore's EC2 model ever nests an element with a
    kept name inside an instance (or spot request), this fails before a wrong read."""
    model = botocore.session.get_session().get_service_model("ec2")
    keep = ec2_lean.KEPT[operation][1]
    nested: list[list[str]] = []

    def walk(node, path, seen):
        if node.name in seen:
            return
        seen = seen | {node.name}
        if node.type_name == "structure":
            for member_name, member in node.members.items():
                xml_name = member.serialization.get("name", member_name)
                xml_name = xml_name[:1].lower() + xml_name[1:]
                if path and xml_name in keep:
                    nested.append(path + [xml_name])
                walk(member, path + [xml_name], seen)
        elif node.type_name == "list":
            walk(node.member, path + ["item"], seen)

    walk(model.shape_for(shape), [], frozenset())
    assert nested == []
