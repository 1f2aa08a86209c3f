"""Device configurations, deploys, status and logs in the control plane.

Over HTTP with a real `provision serve`, a real swtpm minion joined as an Orin NX device (the attested join
of tests/provisioner/test_join_http.py) and the real `provision device-config` / `provision device` CLI:
bad input is refused with one line and stores nothing; a configuration's revisions; set-config and deploy
reach the device only through its heartbeat's desired state (the device keeps the deployed revision until
deployed again); what the device reports shows in `device status` and `device show`; its container's output
comes back with `device logs`; a key never appears in any answer, listing or history."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from provisioner.lab.swtpm import VendorCA
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.finalize import finish_finalize
from tests.fixtures.joins import joinable_control_plane
from tests.provisioner.test_devices import ORIN_NX, add_node, join, join_storage, proof
from tests.provisioner.test_join_http import Minion, api, cli, minion

__all__ = ["minion"]

SECRET = "s3cret-token-value"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """Regions `edge` (central storage) and `other`, each with a datastore."""
    with joinable_control_plane(
        tmp_path_factory,
        tpm_vendor_ca,
        "device-configs",
        [
            ["region", "create", "edge", "--provider", "physical", "--storage-mode", "central"],
            ["region", "create", "other", "--provider", "physical", "--storage-mode", "central"],
        ],
    ) as server:
        for region in ("edge", "other"):
            api(
                server,
                "POST",
                "/v1/datastores",
                {
                    "name": f"nas-{region}",
                    "region": region,
                    "type": "nfs",
                    "address": "10.0.0.5",
                    "root": "/x",
                },
            )
        yield server


def beat(m: Minion, node: dict[str, Any], actual: dict[str, Any] | None = None) -> dict[str, Any]:
    """One heartbeat of the device with `actual` under device_config; the desired device_config."""
    body = {"actual": {"device_config": actual} if actual is not None else {}}
    answer = m.http.post(
        f"/v1/nodes/{node['node_id']}/heartbeat",
        json=body,
        headers={"Authorization": f"Bearer {node['node_credential']}"},
    )
    assert answer.status_code == 200, answer.text
    desired: dict[str, Any] = answer.json()["desired"]["device_config"]
    return desired


def post_log(m: Minion, node: dict[str, Any], **chunk: Any) -> httpx.Response:
    return m.http.post(
        f"/v1/nodes/{node['node_id']}/device/logs",
        json=chunk,
        headers={"Authorization": f"Bearer {node['node_credential']}"},
    )


def one_line_refusal(cp: ControlPlane, *args: str, words: str) -> None:
    out = cli(cp, *args, ok=False)
    assert out.returncode in (1, 2) and len(out.stderr.splitlines()) == 1, out.stderr
    assert words in out.stderr, out.stderr


def test_configs_deploys_status_and_logs(cp: ControlPlane, minion: Callable[[], Minion]) -> None:  # noqa: PLR0915
    storage, device = minion(), minion()
    join_storage(cp, storage)
    add_node(cp, device, "cam-1", "device")
    dnode = join(cp, device, "edge", {"gpus": [], "device": ORIN_NX})
    assert finish_finalize(cp.url, dnode["node_id"], dnode["node_credential"])["state"] == "active"

    # bad input: one line each, nothing stored
    base = [
        "device-config",
        "add",
        "detect",
        "--region",
        "edge",
        "--image",
        "reg.lan/detect:1",
        "--model",
        "yolo",
    ]
    one_line_refusal(cp, *base, words="--command must say what the container runs")
    cmd = ["--command", "python3 serve.py"]
    one_line_refusal(cp, *base, *cmd, "--env", "1BAD=x", words="is not a variable name")
    one_line_refusal(cp, *base, *cmd, "--env", "NOVALUE", words="write --env NAME=VALUE")
    one_line_refusal(
        cp,
        *base,
        *cmd,
        "--datastore",
        "nas-other",
        "--datastore-path",
        "/d",
        words="does not exist in region 'edge'",
    )
    one_line_refusal(
        cp, *base, *cmd, "--datastore", "nas-edge", "--datastore-path", "/d/../..", words="contains '..'"
    )
    one_line_refusal(
        cp, *base, *cmd, "--datastore", "nas-edge", words="--datastore and --datastore-path go together"
    )
    one_line_refusal(cp, *base[:-1], "../up", *cmd, words="is not a name")
    assert api(cp, "GET", "/v1/device-configs")["items"] == []

    # add: revision 1; the key is shown by name only
    full = [*base, *cmd, "--datastore", "nas-edge", "--datastore-path", "/detections", "--checkpoint", "ep10"]
    config_id = cli(cp, *full, "--env", "THRESHOLD=0.5", "--key", f"API_TOKEN={SECRET}").stdout.strip()
    assert config_id.startswith("dcf_")
    one_line_refusal(cp, *full, words="already exists in region 'edge'")
    shown = json.loads(cli(cp, "device-config", "show", "detect", "--json").stdout)
    assert shown["revision"] == 1 and shown["keys"] == ["API_TOKEN"] and shown["env"] == {"THRESHOLD": "0.5"}
    assert shown["datastore_path"] == "/detections" and shown["checkpoints"] == ["ep10"]
    # the same name in another region is another configuration
    cli(cp, "device-config", "add", "detect", "--region", "other", "--image", "i:1", "--model", "m", *cmd)
    listed = cli(cp, "device-config", "list").stdout
    assert listed.count(" detect ") == 2 and "reg.lan/detect:1" in listed

    # set-config: nothing runs until deploy; an active device gets its inference over the heartbeat only
    one_line_refusal(cp, "device", "deploy", "cam-1", words="has no configuration")
    cli(cp, "device", "set-config", "cam-1", "detect")
    assert beat(device, dnode) == {"inference": None}
    cli(cp, "device", "deploy", "cam-1")
    inference = beat(device, dnode)["inference"]
    assert inference["config"] == "detect" and inference["revision"] == 1
    assert inference["image"] == "reg.lan/detect:1" and inference["command"] == "python3 serve.py"
    assert inference["env"] == {"THRESHOLD": "0.5", "API_TOKEN": SECRET}  # to the device, unsealed
    mounts = {m["target"]: m for m in inference["mounts"]}
    assert mounts["/opt/ml/model"]["path"] == "/models/yolo" and mounts["/opt/ml/model"]["read_only"]
    assert mounts["/opt/ml/checkpoints/ep10"]["path"] == "/checkpoints/ep10"
    assert mounts["/opt/ml/output"] == {
        **mounts["/opt/ml/output"],
        "datastore": "nas-edge",
        "path": "/detections",
    }
    assert [d["name"] for d in inference["datastores"]] == ["nas-edge"]
    first = inference["generation"]

    # update: revision 2; the device keeps revision 1 until deploy --latest
    cli(cp, "device-config", "update", "detect", "--region", "edge", "--image", "reg.lan/detect:2")
    assert beat(device, dnode)["inference"]["revision"] == 1
    one_line_refusal(
        cp,
        "device-config",
        "update",
        "detect",
        "--region",
        "edge",
        "--image",
        "reg.lan/detect:2",
        words="nothing to change",
    )
    deployed = json.loads(cli(cp, "device", "deploy", "cam-1", "--latest", "--json").stdout)
    assert deployed["deployed_revision"] == 2 and deployed["inference_status"] == "deploying"
    second = beat(device, dnode)["inference"]
    assert second["revision"] == 2 and second["image"] == "reg.lan/detect:2" and second["generation"] != first
    assert second["env"]["API_TOKEN"] == SECRET  # keys carry over to the new revision

    # the device reports: a report of an older deploy is ignored; running, then exited with its last lines
    gen = second["generation"] + ".b1234"
    beat(device, dnode, {"inference": {"generation": first + ".b1234", "state": "failed", "message": "old"}})
    assert api(cp, "GET", "/v1/nodes/cam-1/device-status")["inference_status"] == "deploying"
    beat(device, dnode, {"inference": {"generation": gen, "state": "running"}})
    status = cli(cp, "device", "status", "cam-1").stdout
    assert "running" in status and "detect" in status
    assert post_log(device, dnode, offset=0, data="loading yolo\n", generation=gen).json() == {
        "acked": 13,
        "eof": False,
    }
    assert (
        post_log(device, dnode, offset=0, data="loading yolo\nserving\n", generation=gen).json()["acked"]
        == 21
    )
    assert (
        post_log(device, dnode, offset=40, data="gap\n", generation=gen).json()["acked"] == 21
    )  # resend from 21
    assert cli(cp, "device", "logs", "cam-1").stdout == "loading yolo\nserving\n"
    lines = "serving\nbye"
    beat(
        device,
        dnode,
        {"inference": {"generation": gen, "state": "exited", "exit_code": 3, "last_lines": lines}},
    )
    assert post_log(device, dnode, offset=21, data="", eof=True, generation=gen).json() == {
        "acked": 21,
        "eof": True,
    }
    assert cli(cp, "device", "logs", "cam-1", "--follow").stdout == "loading yolo\nserving\n"  # ends: exited
    shown_device = cli(cp, "device", "show", "cam-1").stdout
    for words in ("exited", "serving | bye", "detect", "NVIDIA Jetson Orin NX"):
        assert words in shown_device, shown_device
    everything = json.loads(cli(cp, "device", "status", "--json").stdout)
    assert [(s["device"], s["inference_status"], s["exit_code"]) for s in everything] == [
        ("cam-1", "exited", 3)
    ]

    # deploy every device of a configuration; a configuration in use cannot be removed
    deployed_all = json.loads(
        cli(cp, "device", "deploy", "--config", "detect", "--region", "edge", "--json").stdout
    )
    assert [d["device"] for d in deployed_all] == ["cam-1"] and deployed_all[0][
        "inference_status"
    ] == "deploying"
    one_line_refusal(
        cp,
        "device-config",
        "remove",
        "detect",
        "--region",
        "edge",
        "--yes",
        words="is set on device(s) cam-1",
    )
    history = json.loads(cli(cp, "device", "history", "cam-1", "--json").stdout)
    assert any("deployed configuration detect revision 2" in (e["reason"] or "") for e in history)

    # the key never comes back: not in any operator answer, listing or history
    for path in (
        "/v1/device-configs",
        "/v1/device-configs/detect?region=edge",
        "/v1/nodes/cam-1/device-status",
        "/v1/device-status",
        "/v1/nodes/cam-1/history",
        "/v1/nodes/cam-1",
    ):
        assert SECRET not in json.dumps(api(cp, "GET", path)), path
    assert SECRET not in cli(cp, "device-config", "show", "detect", "--region", "edge", "-o", "yaml").stdout


def test_the_join_checks_the_device_section_against_the_service(
    cp: ControlPlane, minion: Callable[[], Minion]
) -> None:
    """A device whose minion reports no Jetson, and a compute node whose minion reports one, go errored at
    their proven join with the way out, and get no credential."""
    if not [n for n in api(cp, "GET", "/v1/nodes?region=edge&service=storage")["items"]]:
        storage = minion()
        join_storage(cp, storage)
    plain, jetson = minion(), minion()
    add_node(cp, plain, "cam-x", "device")
    refused = proof(cp, plain, "edge", {"gpus": []})
    assert refused.status_code == 409 and refused.json()["code"] == "device_section_mismatch", refused.text
    assert "node_credential" not in refused.text
    shown = api(cp, "GET", "/v1/nodes/cam-x")
    assert shown["state"] == "errored" and "reports no Jetson" in shown["reason"]
    api(cp, "POST", "/v1/nodes", {"name": "gpu-x", "region": "edge", "minion_id": jetson.minion_id})
    refused = proof(cp, jetson, "edge", {"gpus": [], "device": ORIN_NX})
    assert refused.status_code == 409 and "`provision device add gpu-x`" in refused.json()["message"]
    assert api(cp, "GET", "/v1/nodes/gpu-x")["state"] == "errored"
