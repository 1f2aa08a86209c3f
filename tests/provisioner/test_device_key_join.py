"""Devices without a TPM: a Jetson Xavier joins with a device key, only in
a region that opts in (docs/join-protocol.md "Devices without a TPM").

Over HTTP with a real `provision serve`, the real `minion id|join --device-key` CLI (its key file in a
state dir) and the real `provision` CLI: refused without the opt-in, pending and then joined with it,
finalized to active, heartbeats that answer their nonce with a signature, `device show` saying what it
proved itself with. The refusals — a key that is not P-256, a minion_id that is not the key's, a compute
node, a device that reports a TPM, a proof signed by another key or over another report — store nothing
and move no node."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from contracts import device_key as contract
from contracts.messages import KeyJoinChallenge
from minion.device_key import DeviceKey
from minion.hardware.inventory import collect
from minion.hardware.model import Tpm
from provisioner.lab.swtpm import VendorCA
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.finalize import finish_finalize
from tests.fixtures.joins import joinable_control_plane
from tests.fixtures.umockdev import minion_executable
from tests.minion.test_jetson import PROFILES
from tests.provisioner.test_devices import ORIN_NX, add_node, join_storage
from tests.provisioner.test_join_http import api, cli, expire_nonce, minion

__all__ = ["minion"]  # test_join_http's swtpm minion (the region's storage node), made against this `cp`

NOT_ALLOWED = "This region does not accept devices without a TPM (region edge)"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """Region `edge` (central storage); a fresh nonce every 2nd heartbeat."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_QUOTE_EVERY", "2")
        with joinable_control_plane(
            tmp_path_factory,
            tpm_vendor_ca,
            "device-key",
            [["region", "create", "edge", "--provider", "physical", "--storage-mode", "central"]],
        ) as server:
            yield server


def ensure_storage(cp: ControlPlane, minion: Callable[[], Any]) -> None:
    """The region's storage node, joined with a swtpm and active (a device is added only then)."""
    with cp.client() as client:
        if client.get("/v1/nodes/store-e").status_code == 404:
            join_storage(cp, minion())


def xavier_inventory(root: Path) -> dict[str, Any]:
    """What the minion collects on an AGX Xavier (its device tree, fuse and L4T files from the profile in
    tests/minion/profiles/jetson/), with no TPM in the kernel, as on the real module."""
    profile = yaml.safe_load((PROFILES / "agx-xavier.yaml").read_text())
    tree = root / "proc" / "device-tree"
    tree.mkdir(parents=True)
    (tree / "model").write_bytes(profile["device_tree"]["model"].encode() + b"\0")
    (tree / "compatible").write_bytes(
        b"".join(c.encode() + b"\0" for c in profile["device_tree"]["compatible"])
    )
    fuse = root / "sys" / "module" / "tegra_fuse" / "parameters"
    fuse.mkdir(parents=True)
    (fuse / "tegra_chip_id").write_text(profile["tegra_chip_id"] + "\n")
    (root / "etc").mkdir()
    (root / "etc" / "nv_tegra_release").write_text(profile["nv_tegra_release"] + "\n")
    (root / "proc" / "meminfo").write_text(f"MemTotal:       {profile['memtotal_kb']} kB\n")
    (root / "proc" / "cpuinfo").write_text("processor\t: 0\n\nprocessor\t: 1\n")
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "hostname").write_text("xavier-1\n")
    inventory = dataclasses.replace(collect(root), tpm=Tpm(present=False, source="a Xavier has no TPM"))
    document: dict[str, Any] = inventory.to_json()
    assert document["device"]["model"] == "agx-xavier" and document["device"]["tpm"] == "none"
    return document


def run_minion(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(minion_executable()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TSS2_LOG": "all+none", **(env or {})},
    )


def join_token(cp: ControlPlane) -> str:
    return str(api(cp, "POST", "/v1/regions/edge/join-tokens", {"ttl": "1h"})["token"])


def pending_row(cp: ControlPlane, minion_id: str) -> dict[str, Any] | None:
    rows = api(cp, "GET", "/v1/pending-minions")["items"]
    return next((r for r in rows if r["minion_id"] == minion_id), None)


def beat(cp: ControlPlane, node: dict[str, Any], **body: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{cp.url}/v1/nodes/{node['node_id']}/heartbeat",
        json={"actual": {}, **body},
        headers={"Authorization": f"Bearer {node['node_credential']}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def beat_until_asked(cp: ControlPlane, node: dict[str, Any]) -> str:
    """Heartbeats until one answers with a nonce (every 2nd here); that nonce."""
    for _ in range(4):
        nonce = beat(cp, node)["quote_nonce"]
        if nonce:
            return str(nonce)
    raise AssertionError("no nonce asked for in 4 heartbeats")


def test_a_xavier_joins_with_its_device_key_only_where_the_region_allows_it(  # noqa: PLR0915
    cp: ControlPlane, minion: Callable[[], Any], tmp_path: Path
) -> None:
    ensure_storage(cp, minion)
    state = tmp_path / "state"
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(xavier_inventory(tmp_path / "root")))
    # the identity: created at first use, 0600, the same minion_id every time after
    first = run_minion("id", "--device-key", "--state-dir", str(state), "--json")
    assert first.returncode == 0, first.stderr
    shown = json.loads(first.stdout)
    minion_id = shown["minion_id"]
    key_file = state / "device-key.pem"
    assert shown["source"] == str(key_file) and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    public = serialization.load_pem_private_key(key_file.read_bytes(), None).public_key()
    assert minion_id == contract.minion_id(contract.spki(public))  # type: ignore[arg-type]
    again = run_minion("id", "--device-key", "--state-dir", str(state), "--qr")
    assert again.returncode == 0 and again.stdout.splitlines()[0] == minion_id, again.stderr
    join = [
        "join",
        "--device-key",
        "--control-plane",
        cp.url,
        "--join-token",
        join_token(cp),
        "--inventory",
        str(inventory),
        "--state-dir",
        str(state),
    ]
    # without the region's opt-in: refused with the command that allows it, nothing listed
    refused = run_minion(*join)
    assert refused.returncode == 1 and NOT_ALLOWED in refused.stdout, refused.stdout + refused.stderr
    assert "provision region update REGION --allow-devices-without-tpm" in refused.stdout
    assert pending_row(cp, minion_id) is None
    refusals = cli(cp, "node", "refusals", "--minion-id", minion_id, "--json").stdout
    assert "join_device_key_not_allowed" in refusals, refusals
    # with it: attested and pending, shown as a device key
    region = json.loads(cli(cp, "region", "update", "edge", "--allow-devices-without-tpm", "--json").stdout)
    assert region["settings"]["allow_devices_without_tpm"] is True
    pending = run_minion(*join)
    assert pending.returncode == 0 and pending.stdout.startswith("pending: attested"), pending.stdout
    row = pending_row(cp, minion_id)
    assert row is not None and row["attested"] is True and row["identity"] == "device-key", row
    wide = cli(cp, "node", "pending", "-o", "wide").stdout
    assert "device-key" in wide, wide
    # added as a device: joined, finalized, active without maintenance
    cli(cp, "device", "add", "xav-1", "--region", "edge", "--minion-id", minion_id)
    joined = run_minion(*join, "--json")
    assert joined.returncode == 0, joined.stdout + joined.stderr
    outcome = json.loads(joined.stdout)
    assert outcome["state"] == "joined" and outcome["node"]["state"] == "provisioning", outcome
    node = json.loads((state / "node.json").read_text())
    assert stat.S_IMODE((state / "node.json").stat().st_mode) == 0o600
    assert finish_finalize(cp.url, node["node_id"], node["node_credential"])["state"] == "active"
    # heartbeats: a nonce answered with the device key's signature counts as the node's last proof
    key = DeviceKey.load_or_create(state)
    nonce = beat_until_asked(cp, node)
    signature = key.heartbeat_signature(node["node_id"], nonce)
    assert beat(cp, node, key_signature=base64.b64encode(signature).decode())["state"] == "active"
    as_json = json.loads(cli(cp, "device", "show", "xav-1", "-o", "json").stdout)
    assert as_json["identity"] == "device-key" and as_json["last_quote_at"] is not None, as_json
    assert as_json["device"]["model"] == "agx-xavier" and as_json["device"]["tpm"] == "none"
    text = cli(cp, "device", "show", "xav-1").stdout
    assert "device key (no TPM" in text, text
    history = json.loads(cli(cp, "device", "history", "xav-1", "--json").stdout)
    assert any("device key proven" in (e["reason"] or "") for e in history), history
    # the key's own signature over a nonce that expired on the way is late: neither proof nor refusal,
    # and the answer asks again
    nonce = beat_until_asked(cp, node)
    expire_nonce(cp, {"nonce": nonce})
    late = beat(
        cp, node, key_signature=base64.b64encode(key.heartbeat_signature(node["node_id"], nonce)).decode()
    )
    assert late["state"] == "active" and late["quote_nonce"] not in (None, nonce), late
    # a signature by any other key is refused: the device is errored with the reason
    other = DeviceKey.load_or_create(tmp_path / "thief")
    nonce = beat_until_asked(cp, node)
    forged = other.heartbeat_signature(node["node_id"], nonce)
    answer = beat(cp, node, key_signature=base64.b64encode(forged).decode())
    assert answer["state"] == "errored", answer
    assert answer["reason"].startswith("continuous attestation: The answer's signature does not verify")
    assert "provision node retry" in answer["reason"] and "restart the join" not in answer["reason"]


def _begin(cp: ControlPlane, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{cp.url}/v1/join", json=body, timeout=30)


def _prove(cp: ControlPlane, join_id: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{cp.url}/v1/join/{join_id}/proof",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def _refused(answer: httpx.Response, code: str, words: str) -> None:
    assert answer.status_code == 403, answer.text
    assert answer.json()["code"] == code and words in answer.json()["message"], answer.text


XAVIER_NX = {
    **ORIN_NX,
    "model": "xavier-nx",
    "model_name": "NVIDIA Jetson Xavier NX",
    "tpm": "none",
    "chip_id": 0x19,
}


def test_what_a_device_key_cannot_do_changes_nothing(
    cp: ControlPlane, minion: Callable[[], Any], tmp_path: Path
) -> None:
    ensure_storage(cp, minion)
    api(cp, "POST", "/v1/regions/edge/attestation", {"allow_devices_without_tpm": True})
    token = join_token(cp)
    key = DeviceKey.load_or_create(tmp_path / "device")
    inventory = {"device": XAVIER_NX, "tpm": {"present": False}}
    good = key.join_request(join_token=token, inventory=inventory, requirements={})
    # a key that is not ECDSA P-256, and a minion_id that is not the key's
    rsa_spki = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    rsa_body = {
        **good,
        "device_key": base64.b64encode(rsa_spki).decode(),
        "minion_id": contract.minion_id(rsa_spki),
    }
    _refused(_begin(cp, rsa_body), "attestation_device_key_invalid", "not an ECDSA P-256 public key")
    _refused(_begin(cp, {**good, "minion_id": "0" * 32}), "attestation_minion_id_mismatch", "does not match")
    # a device that reports a TPM (in the kernel, or by its model) must attest with it
    with_tpm = {**good, "inventory": {"device": XAVIER_NX, "tpm": {"present": True, "device": "tpm0"}}}
    _refused(_begin(cp, with_tpm), "attestation_identity_downgrade", "its inventory reports a TPM (tpm0)")
    orin = {**good, "inventory": {"device": ORIN_NX}}
    _refused(_begin(cp, orin), "attestation_identity_downgrade", "its model orin-nx has a firmware TPM")
    assert pending_row(cp, key.minion_id) is None
    # a device node for it: a proof signed by another key, or over another report, moves nothing
    add_node(cp, _Named(key.minion_id), "xav-2", "device")
    thief = DeviceKey.load_or_create(tmp_path / "thief")
    swapped = {"device": {**XAVIER_NX, "gpu_cores": 9999}, "tpm": {"present": False}}

    def beat_signature(challenge: KeyJoinChallenge) -> dict[str, Any]:
        """A heartbeat's signature over the challenge's nonce: no join proof (domain separation)."""
        signed = key.heartbeat_signature(challenge.join_id, base64.b64encode(challenge.nonce).decode())
        return {"version": 1, "signature": base64.b64encode(signed).decode()}

    forged: list[Callable[[KeyJoinChallenge], dict[str, Any]]] = [
        lambda challenge: thief.proof(challenge, inventory, {}),  # another key
        lambda challenge: key.proof(challenge, swapped, {}),  # over another report than step 1's
        beat_signature,
    ]
    for proof in forged:
        first = _begin(cp, good)
        assert first.status_code == 201, first.text
        challenge = KeyJoinChallenge.model_validate_json(first.content)
        _refused(
            _prove(cp, challenge.join_id, token, proof(challenge)),
            "attestation_device_key_signature_invalid",
            "not made by the device holding that key",
        )
    shown = api(cp, "GET", "/v1/nodes/xav-2")
    assert shown["state"] == "new" and shown["inventory"] is None and shown["identity"] is None, shown
    # a compute node's minion_id cannot join with a device key
    compute_key = DeviceKey.load_or_create(tmp_path / "compute")
    add_node(cp, _Named(compute_key.minion_id), "gpu-9", "compute")
    body = compute_key.join_request(join_token=token, inventory=inventory, requirements={})
    _refused(_begin(cp, body), "join_device_key_not_a_device", "'gpu-9' is a compute node")
    # the honest proof joins
    first = _begin(cp, good)
    challenge = KeyJoinChallenge.model_validate_json(first.content)
    joined = _prove(cp, challenge.join_id, token, key.proof(challenge, inventory, {}))
    assert joined.status_code == 200 and joined.json()["node_name"] == "xav-2", joined.text
    # withdrawing the opt-in refuses a join already begun (at its proof) and every later one
    begun = KeyJoinChallenge.model_validate_json(_begin(cp, good).content)
    api(cp, "POST", "/v1/regions/edge/attestation", {"allow_devices_without_tpm": False})
    late = _prove(cp, begun.join_id, token, key.proof(begun, inventory, {}))
    _refused(late, "join_device_key_not_allowed", NOT_ALLOWED)
    _refused(_begin(cp, good), "join_device_key_not_allowed", NOT_ALLOWED)


@dataclasses.dataclass
class _Named:
    """What add_node needs of a minion: its minion_id."""

    minion_id: str


def test_the_signed_messages_are_bound_to_their_purpose_join_and_report() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    spki = contract.spki(private.public_key())
    digest = contract.report_digest({"device": {"model": "agx-xavier"}}, {})
    message = contract.join_message("j1", contract.minion_id(spki), b"n" * 32, digest)
    signature = contract.sign(private, message)
    assert contract.verifies(spki, signature, message)
    for other in (
        contract.join_message("j2", contract.minion_id(spki), b"n" * 32, digest),
        contract.join_message("j1", contract.minion_id(spki), b"m" * 32, digest),
        contract.join_message("j1", contract.minion_id(spki), b"n" * 32, contract.report_digest({}, {})),
        contract.heartbeat_message("j1", b"n" * 32),
    ):
        assert not contract.verifies(spki, signature, other)
    # key order does not change the digest (both ends canonicalise); a value does
    assert contract.report_digest({"a": 1, "b": 2}, {}) == contract.report_digest({"b": 2, "a": 1}, {})
    assert contract.report_digest({"a": 1}, {}) != contract.report_digest({"a": 2}, {})
    with pytest.raises(contract.DeviceKeyError, match="ECDSA P-256"):
        contract.load_public(contract.spki(ec.generate_private_key(ec.SECP384R1()).public_key()))
