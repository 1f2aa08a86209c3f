"""Store + service rules, on SQLite AND PostgreSQL (the `store` fixture is parametrized)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RigbaseError, RuleViolation, Unavailable
from provisioner.domain.states import NODE_TRANSITIONS, NodeState
from provisioner.services.fleet import nodes, region_removal
from provisioner.services.regions import providers, regions
from provisioner.store.engine import make_engine
from provisioner.store.migrate import upgrade
from provisioner.store.schema import metadata
from tests.fixtures.postgres import Store

ACTOR = "operator:test"
MID = [f"{i:032x}" for i in range(1, 20)]


def _seed(session: Session) -> None:
    providers.enable(session, "physical", {}, actor=ACTOR)
    regions.create(session, "lab-1", provider="physical", actor=ACTOR)
    regions.create(
        session, "central-1", provider="physical", storage_mode="central", public_jobs=False, actor=ACTOR
    )
    nodes.add(session, "gpu-1", region="lab-1", minion_id=MID[0], actor=ACTOR)
    # storage nodes serve central regions only
    nodes.add(session, "store-1", region="central-1", minion_id=MID[1], service="storage", actor=ACTOR)


@pytest.fixture
def seeded(store: Store) -> Store:
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        _seed(s)
    return store


def _walk_to_active(session: Session, name: str) -> None:
    node = nodes.get(session, name)
    for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE, NodeState.ACTIVE):
        nodes.transition(session, node, state, actor="minion:test", reason=f"join step {state}")


def test_migrations_match_models(store: Store) -> None:
    """The Alembic revisions build exactly the schema the models describe, on both backends."""
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_upgrade_is_idempotent(seeded: Store) -> None:
    before = seeded.snapshot()
    upgrade(seeded.url)
    assert seeded.snapshot() == before


def test_lifecycle_and_audit_trail(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        _walk_to_active(s, "gpu-1")
        nodes.maintenance(s, "gpu-1", "on", actor=ACTOR)
        nodes.maintenance(s, "gpu-1", "toggle", actor=ACTOR)
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        node, events = nodes.history(s, "gpu-1")
        assert node.state == "active"
        assert [(e.from_state, e.to_state) for e in events] == [
            (None, "new"),
            ("new", "enrolling"),
            ("enrolling", "provisioning"),
            ("provisioning", "maintenance"),
            ("maintenance", "active"),
            ("active", "maintenance"),
            ("maintenance", "active"),
        ]
        assert events[1].actor == "minion:test" and events[-1].actor == ACTOR
        assert events[-1].reason == "maintenance off by operator"
        assert all(e.at.tzinfo is not None for e in events)


def test_every_illegal_transition_is_refused_naming_the_current_state(seeded: Store) -> None:
    """Drive a node into each state, then try every target the table forbids."""
    paths = {
        NodeState.NEW: [],
        NodeState.ENROLLING: ["enrolling"],
        NodeState.PROVISIONING: ["enrolling", "provisioning"],
        NodeState.MAINTENANCE: ["enrolling", "provisioning", "maintenance"],
        NodeState.ACTIVE: ["enrolling", "provisioning", "maintenance", "active"],
        NodeState.ERRORED: ["errored"],
        NodeState.REMOVED: ["removed"],
    }
    refused = 0
    for i, (state, path) in enumerate(paths.items()):
        with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
            node = nodes.add(s, f"n{i}", region="lab-1", minion_id=MID[5 + i], actor=ACTOR)
            for step in path:
                nodes.transition(
                    s, node, NodeState(step), actor=ACTOR, reason="errored" if step == "errored" else None
                )
        for target in set(NodeState) - NODE_TRANSITIONS[state]:
            before = seeded.snapshot()
            with pytest.raises(RuleViolation) as err, seeded.sessions.begin() as s:  # type: ignore[attr-defined]
                node = nodes.get(s, f"n{i}", include_removed=True)
                nodes.transition(s, node, target, actor=ACTOR)
            assert f"is {state.value} and cannot go to {target.value}" in err.value.message
            assert seeded.snapshot() == before
            refused += 1
    assert refused == sum(len(set(NodeState) - allowed) for allowed in NODE_TRANSITIONS.values())


def test_errored_keeps_reason_and_retry_goes_back_to_new(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        node = nodes.get(s, "gpu-1")
        nodes.transition(
            s, node, NodeState.ERRORED, actor="minion:x", reason="PCR 11 does not match the manifest"
        )
        assert node.reason == "PCR 11 does not match the manifest"
        nodes.transition(s, node, NodeState.NEW, actor=ACTOR, reason="retry")
        assert node.reason is None


BAD: list[tuple[str, type[RigbaseError], str, Callable[[Session], object]]] = [
    (
        "region name",
        InvalidInput,
        "not a DNS label",
        lambda s: regions.create(s, "Lab_1", provider="physical", actor=ACTOR),
    ),
    (
        "long region name",
        InvalidInput,
        "not a DNS label",
        lambda s: regions.create(s, "a" * 64, provider="physical", actor=ACTOR),
    ),
    (
        "hyphen edge",
        InvalidInput,
        "not a DNS label",
        lambda s: regions.create(s, "-lab", provider="physical", actor=ACTOR),
    ),
    (
        "unknown provider",
        InvalidInput,
        "unknown provider",
        lambda s: regions.create(s, "x", provider="aws", actor=ACTOR),
    ),
    (
        "provider not enabled",
        NotFound,
        "not enabled",
        lambda s: regions.create(s, "x", provider="gcp", actor=ACTOR),
    ),
    (
        "storage mode",
        InvalidInput,
        "storage mode",
        lambda s: regions.create(s, "x", provider="physical", storage_mode="nas", actor=ACTOR),
    ),
    (
        "duplicate region",
        Conflict,
        "already exists",
        lambda s: regions.create(s, "lab-1", provider="physical", actor=ACTOR),
    ),
    (
        "provider twice",
        Conflict,
        "already enabled",
        lambda s: providers.enable(s, "physical", {}, actor=ACTOR),
    ),
    (
        "payment mode",
        InvalidInput,
        "payment mode",
        lambda s: providers.enable(s, "physical", {"payment_mode": "card"}, actor=ACTOR),
    ),
    (
        "node name",
        InvalidInput,
        "not a DNS label",
        lambda s: nodes.add(s, "GPU 2", region="lab-1", minion_id=MID[9], actor=ACTOR),
    ),
    (
        "minion_id upper",
        InvalidInput,
        "32 lowercase hex",
        lambda s: nodes.add(s, "g2", region="lab-1", minion_id=MID[9].upper().replace("0", "A"), actor=ACTOR),
    ),
    (
        "minion_id short",
        InvalidInput,
        "32 lowercase hex",
        lambda s: nodes.add(s, "g2", region="lab-1", minion_id="abc", actor=ACTOR),
    ),
    (
        "unknown region",
        NotFound,
        "region 'nowhere' does not exist",
        lambda s: nodes.add(s, "g2", region="nowhere", minion_id=MID[9], actor=ACTOR),
    ),
    (
        "duplicate node name",
        Conflict,
        "already exists in region",
        lambda s: nodes.add(s, "gpu-1", region="lab-1", minion_id=MID[9], actor=ACTOR),
    ),
    (
        "duplicate minion_id",
        Conflict,
        "held by node 'gpu-1' in region 'lab-1'",
        lambda s: nodes.add(s, "g2", region="central-1", minion_id=MID[0], actor=ACTOR),
    ),
    (
        "second storage node",
        Conflict,
        "already has storage node 'store-1'",
        lambda s: nodes.add(s, "s2", region="central-1", minion_id=MID[9], service="storage", actor=ACTOR),
    ),
    (
        "storage node in a local region",
        RuleViolation,
        "storage nodes serve only regions in central storage mode",
        lambda s: nodes.add(s, "s2", region="lab-1", minion_id=MID[9], service="storage", actor=ACTOR),
    ),
    (
        "central needs an active storage node",
        RuleViolation,
        "storage node 'store-1' is new, not active",
        lambda s: nodes.add(s, "g2", region="central-1", minion_id=MID[9], actor=ACTOR),
    ),
    (
        "service",
        InvalidInput,
        "service",
        lambda s: nodes.add(s, "g2", region="lab-1", minion_id=MID[9], service="gpu", actor=ACTOR),
    ),
    (
        "hostname",
        InvalidInput,
        "hostname",
        lambda s: nodes.add(s, "g2", region="lab-1", minion_id=MID[9], hostname="bad host", actor=ACTOR),
    ),
    (
        "maintenance off on new",
        RuleViolation,
        "is new: it waits for its minion",
        lambda s: nodes.maintenance(s, "gpu-1", "off", actor=ACTOR),
    ),
    (
        "maintenance mode",
        InvalidInput,
        "maintenance mode",
        lambda s: nodes.maintenance(s, "gpu-1", "sometimes", actor=ACTOR),
    ),
    (
        "replace compute",
        RuleViolation,
        "only storage nodes",
        lambda s: nodes.replace(s, "gpu-1", minion_id=MID[9], actor=ACTOR),
    ),
    (
        "replace with taken id",
        Conflict,
        "held by node 'gpu-1'",
        lambda s: nodes.replace(s, "store-1", minion_id=MID[0], actor=ACTOR),
    ),
    ("unknown node", NotFound, "node 'ghost'", lambda s: nodes.remove(s, "ghost", actor=ACTOR)),
    (
        "region with nodes",
        Conflict,
        "still has 1 node(s) (gpu-1)",
        lambda s: region_removal.remove(s, "lab-1", actor=ACTOR),
    ),
    (
        "provider with regions",
        Conflict,
        "still has regions",
        lambda s: providers.remove(s, "physical", actor=ACTOR),
    ),
    ("page too big", InvalidInput, "limit 501", lambda s: nodes.list_page(s, limit=501)),
]


@pytest.mark.parametrize("label,error,fragment,call", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_and_changes_nothing(
    seeded: Store, label: str, error: type[RigbaseError], fragment: str, call: Callable[[Session], object]
) -> None:
    before = seeded.snapshot()
    with pytest.raises(error) as err, seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        call(s)
    assert fragment in err.value.message
    assert "\n" not in err.value.message and ": " in err.value.message  # one line, says what to do
    assert seeded.snapshot() == before


def test_storage_rules_replace_and_forced_region_removal(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        _walk_to_active(s, "store-1")
        nodes.add(s, "gpu-a", region="central-1", minion_id=MID[11], actor=ACTOR)  # allowed: storage active
        new = nodes.replace(s, "store-1", minion_id=MID[12], actor=ACTOR)
        assert (new.name, new.state, new.service) == ("store-1", "new", "storage")
        with pytest.raises(RuleViolation, match="storage node 'store-1' is new, not active"):
            nodes.add(s, "gpu-c", region="central-1", minion_id=MID[13], actor=ACTOR)
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        _, events = nodes.history(s, "store-1")
        assert [e.to_state for e in events][-3:] == ["active", "removed", "new"]
        _walk_to_active(s, "store-1")
        # the replaced hardware's minion_id is free again
        nodes.add(s, "gpu-b", region="central-1", minion_id=MID[1], actor=ACTOR)
        region_removal.remove(s, "central-1", force=True, actor=ACTOR)
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        assert [r.name for r in regions.list_all(s)] == ["lab-1"]
        rows, _ = nodes.list_page(s, include_removed=True)
        assert {n.name: n.state for n in rows if n.region_name == "central-1"} == {
            "store-1": "removed",
            "gpu-a": "removed",
            "gpu-b": "removed",
        }
        # the name is free again after removal
        regions.create(s, "central-1", provider="physical", actor=ACTOR)


def test_online_is_derived_from_the_last_heartbeat(seeded: Store) -> None:
    from provisioner.api.schemas import NodeOut

    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        node = nodes.get(s, "gpu-1")
        assert NodeOut.of(node).online is False
        nodes.record_report(s, node, inventory={"gpus": 2}, requirements={"ok": True})
        assert NodeOut.of(node).online is True
        nodes.record_report(s, node, at=datetime.now(UTC) - timedelta(minutes=5))
        out = NodeOut.of(node)
        assert out.online is False and out.state == "new" and out.inventory == {"gpus": 2}


def test_keyset_pagination_visits_every_node_once(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        for i in range(23):
            nodes.add(s, f"p{i}", region="lab-1", minion_id=f"{0xABC000 + i:032x}", actor=ACTOR)
    seen: list[str] = []
    after = None
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        while True:
            rows, after = nodes.list_page(s, limit=5, after=after)
            seen += [n.id for n in rows]
            if after is None:
                break
        assert len(seen) == len(set(seen)) == 25
        assert len(nodes.list_page(s, region="lab-1", limit=500)[0]) == 24  # store-1 is in central-1


def test_schema_newer_than_the_code_is_refused(store: Store) -> None:
    with store.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    before = store.snapshot()
    with pytest.raises(Unavailable) as err:
        upgrade(store.url)
    assert err.value.code == "schema_too_new"
    assert "9999_from_the_future" in err.value.message and "upgrade rigbase" in err.value.message
    assert store.snapshot() == before


def test_unreachable_database_is_one_line() -> None:
    from tests.fixtures.postgres import free_port

    url = f"postgresql+psycopg://postgres:secret@127.0.0.1:{free_port()}/rigbase"
    with pytest.raises(Unavailable) as err:
        upgrade(url, make_engine(url))
    assert "cannot reach the database at" in err.value.message and "\n" not in err.value.message
    assert "secret" not in err.value.message


def _bundle_fields() -> list[str]:
    """The field column of docs/enrollment-bundle.md's table: the contract the bundle must match."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "enrollment-bundle.md").read_text()
    return re.findall(r"^\| `(\w+)` \|", doc, flags=re.M)


def test_one_enrollment_bundle_for_the_route_and_the_gcp_storage_node(
    seeded: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.services.cloud import gcp
    from provisioner.services.fleet import join_tokens

    monkeypatch.setenv("RIGBASE_PUBLIC_URL", "https://cp.example:8470")  # read by the fallback runtime
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        region = regions.get(s, "central-1")
        row, token = join_tokens.issue(s, "central-1", ttl="2h", actor=ACTOR)
        bundle = join_tokens.bundle(
            s,
            region,
            token,
            control_plane_url="https://cp.example:8470",
            ca_certificate="-----BEGIN CERTIFICATE-----",
        )
        assert list(bundle) == _bundle_fields()
        assert bundle == {
            "version": 1,
            "control_plane_url": "https://cp.example:8470",
            "ca_certificate": "-----BEGIN CERTIFICATE-----",
            "region": "central-1",
            "region_id": region.id,
            "provider": "physical",
            "join_token": token,
            "expires_at": row.expires_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "storage_mode": "central",
            "public_jobs": False,
        }
        assert bundle["expires_at"].endswith("Z")
        # the GCP storage node's metadata is the same function with the URL VMs reach (no CA: none is set)
        assert gcp.enrollment_bundle(s, region, token) == {**bundle, "ca_certificate": None}
        _, forever = join_tokens.issue(s, "lab-1", ttl="never", actor=ACTOR)
        lab = join_tokens.bundle(
            s, regions.get(s, "lab-1"), forever, control_plane_url="http://127.0.0.1:8470"
        )
        assert (lab["expires_at"], lab["storage_mode"], lab["public_jobs"]) == (None, "local", True)


def test_maintenance_is_idempotent_and_says_what_a_new_node_waits_for(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        with pytest.raises(RuleViolation, match="waits for its minion.*node pending.*node refusals"):
            nodes.maintenance(s, "gpu-1", "off", actor=ACTOR)  # still new
        _walk_to_active(s, "gpu-1")
        before = len(nodes.history(s, "gpu-1")[1])
        assert nodes.maintenance(s, "gpu-1", "off", actor=ACTOR).state == "active"  # already active: fine
        assert len(nodes.history(s, "gpu-1")[1]) == before  # …and nothing written


def test_a_storage_node_in_use_is_removed_only_with_force_naming_its_users(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        _walk_to_active(s, "store-1")
        nodes.add(s, "gpu-a", region="central-1", minion_id=MID[11], actor=ACTOR)
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        with pytest.raises(RuleViolation, match=r"serves the cache of 1 compute node\(s\).*gpu-a.*--force"):
            nodes.remove(s, "store-1", actor=ACTOR)
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        assert nodes.get(s, "store-1").state == "active"  # the refusal changed nothing
        gone = nodes.remove(s, "store-1", actor=ACTOR, force=True)
        assert gone.state == "removed" and "--force" in (nodes.history(s, "store-1")[1][-1].reason or "")
