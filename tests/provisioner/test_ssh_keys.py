"""The control plane's SSH key pair (provisioner/services/ssh_keys.py) and where finalize sends SSH."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from provisioner.adapters.ansible import SshTarget
from provisioner.reconcilers.finalize import target_for
from provisioner.services import node_address, ssh_keys
from provisioner.settings import Settings
from provisioner.store.models import Node


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def key_of(home: Path) -> Path:
    return Settings(home=home).ssh_key_path


def test_key_pair_is_created_once_private_and_reused(home: Path) -> None:
    # several workers on first use: one key wins, every caller sees it
    with ThreadPoolExecutor(8) as pool:
        lines = set(pool.map(lambda _: ssh_keys.authorized_key_line(key_of(home)), range(16)))
    assert len(lines) == 1
    line = lines.pop()
    kind, blob, comment = line.split(" ")
    assert kind == "ssh-ed25519" and comment == "rigbase-control-plane" and base64.b64decode(blob)
    private = home / "ssh" / "id_ed25519"
    assert private.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert private.stat().st_mode & 0o777 == 0o600 and private.parent.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in private.parent.iterdir()) == ["id_ed25519"], "no temp files left behind"
    pem = private.read_bytes()
    assert ssh_keys.authorized_key_line(key_of(home)) == line and private.read_bytes() == pem
    key = serialization.load_ssh_private_key(pem, password=None)
    assert (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        == f"{kind} {blob}"
    )
    private.unlink()  # rotation: a new pair on next use
    assert ssh_keys.authorized_key_line(key_of(home)) != line


def test_finalize_target_prefers_hostname_then_observed_address_then_name(home: Path, tmp_path: Path) -> None:
    node = Node(name="gpu-7", hostname=None, inventory={"gpus": []}, lab_root=None)
    assert target_for(node, key_of(home)) == SshTarget(host="gpu-7", key_file=home / "ssh" / "id_ed25519")
    node_address.record(node, "192.0.2.17")
    assert node.inventory == {"gpus": [], "observed_address": "192.0.2.17"}
    assert target_for(node, key_of(home)).host == "192.0.2.17"
    node.hostname = "gpu-7.example.net"
    assert target_for(node, key_of(home)).host == "gpu-7.example.net"
    own = Settings(home=home, ssh_key=tmp_path / "own_key").ssh_key_path  # RIGBASE_SSH_KEY
    assert target_for(node, own).key_file == tmp_path / "own_key"
