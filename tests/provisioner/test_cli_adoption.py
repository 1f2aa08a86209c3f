"""salt-key's flow through the real `provision` against a real server and minions with their own swtpm: `node
accept MINION_ID --name`, `node accept --all-passing` (confirmation listing what
it adopts), `node reject` (joins refused with `join_minion_rejected`, audited) and `node unreject`."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.fixtures.control_plane import ControlPlane
from tests.provisioner.test_join_http import Minion, cli, cp, minion, token

__all__ = ["cp", "minion"]


def _pending_ids(cp: ControlPlane) -> set[str]:
    return {p["minion_id"] for p in json.loads(cli(cp, "node", "pending", "--json").stdout)}


def test_accept_one_and_all_passing(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    one, two, three = minion(), minion(), minion()
    jt = token(cp)
    for m in (one, two, three):
        assert m.join(jt).status_code == 202
    assert {one.minion_id, two.minion_id, three.minion_id} <= _pending_ids(cp)
    # one by id and name: the region comes from the pending list; the id alone on stdout
    out = cli(cp, "node", "accept", one.minion_id, "--name", "acc-1")
    node_id = out.stdout.strip()
    shown = json.loads(cli(cp, "node", "show", "acc-1", "-o", "json").stdout)
    assert shown["id"] == node_id and shown["region"] == "lab" and shown["minion_id"] == one.minion_id
    # its next attempt joins, with its inventory: the node list sums up its GPUs
    gpus = [{"model": "RTX 4090", "name": "NVIDIA GeForce RTX 4090"}] * 4 + [
        {"model": "T4", "name": "Tesla T4"}
    ]
    first = one.begin(jt, inventory={"gpus": gpus})
    assert first.status_code == 201, first.text
    assert one.prove(first.json(), jt).status_code == 200
    listed = cli(cp, "node", "list", "--region", "lab").stdout
    row = next(line for line in listed.splitlines() if " acc-1 " in f" {line} ")
    assert "4x RTX 4090, 1x T4" in row
    wrong = cli(cp, "node", "accept", two.minion_id, "--name", "x", "--region", "other", ok=False)
    assert wrong.returncode == 1 and "called with region lab's bundle" in wrong.stderr
    unknown = cli(cp, "node", "accept", "f" * 32, "--name", "x", ok=False)
    assert unknown.returncode == 1 and "is not pending" in unknown.stderr
    # every passing one: listed with the question (stderr); without a terminal it needs --yes
    asked = cli(cp, "node", "accept", "--all-passing", ok=False)
    assert asked.returncode == 2 and "pass --yes" in asked.stderr
    assert two.minion_id in asked.stderr and f"node-{two.minion_id[:8]}" in asked.stderr
    assert _pending_ids(cp) >= {two.minion_id, three.minion_id}  # nothing changed
    adopted = cli(cp, "node", "accept", "--all-passing", "--yes").stdout.split()
    assert len(adopted) == 2 and all(i.startswith("node_") for i in adopted)
    names = {n["name"] for n in json.loads(cli(cp, "node", "list", "--region", "lab", "-o", "json").stdout)}
    assert {f"node-{two.minion_id[:8]}", f"node-{three.minion_id[:8]}"} <= names
    assert not _pending_ids(cp) & {two.minion_id, three.minion_id}


def test_reject_refuses_joins_until_unreject(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    assert m.join(jt).status_code == 202 and m.minion_id in _pending_ids(cp)
    out = cli(cp, "node", "reject", m.minion_id, "--reason", "not our hardware")
    assert f"provision node unreject {m.minion_id}" in out.stdout
    assert m.minion_id not in _pending_ids(cp)
    refused = m.begin(jt)
    assert refused.status_code == 403 and refused.json()["code"] == "join_minion_rejected", refused.text
    assert "not our hardware" in refused.json()["message"]
    refusals = cli(cp, "node", "refusals", "--minion-id", m.minion_id, "-o", "wide").stdout
    assert "join_minion_rejected" in refusals and "not our hardware" in refusals
    listed = json.loads(cli(cp, "node", "rejected", "-o", "json").stdout)
    assert [(r["minion_id"], r["reason"], r["state"]) for r in listed] == [
        (m.minion_id, "not our hardware", "rejected")
    ]
    assert m.minion_id in cli(cp, "node", "rejected").stdout
    cli(cp, "node", "reject", m.minion_id)  # again: nothing changes, exit 0
    # reversible: the next attempt is pending again
    assert "may join again" in cli(cp, "node", "unreject", m.minion_id).stdout
    assert m.join(jt).status_code == 202 and m.minion_id in _pending_ids(cp)
    again = cli(cp, "node", "unreject", m.minion_id, ok=False)
    assert again.returncode == 1 and "is not rejected" in again.stderr
    # a minion a node holds is not rejected: the node goes first
    cli(cp, "node", "accept", m.minion_id, "--name", "held")
    held = cli(cp, "node", "reject", m.minion_id, ok=False)
    assert held.returncode == 1 and "provision node remove held" in held.stderr
    bad = cli(cp, "node", "reject", "XYZ", ok=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
