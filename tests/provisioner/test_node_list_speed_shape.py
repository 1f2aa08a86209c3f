"""The node list's fast page (provisioner/api/node_page.py) is the NodeOut page, on SQLite and PostgreSQL:
same keys in the same order, same values, reports stored before they were bounded shown as unreadable —
and it stays one query however many nodes a page holds. (Its speed is a benchmark, bench/bench_api.py, not
a test: timings on a shared machine would make a flaky test.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from provisioner.api.node_page import ITEM_KEYS, nodes_page_json
from provisioner.api.schemas import UNREADABLE_REPORT, NodeOut, Page
from provisioner.services.fleet import nodes
from provisioner.services.regions import providers, regions
from provisioner.store.join_models import NodeAttestation
from tests.fixtures.postgres import Store

ACTOR = "operator:test"


def _engine(store: Store) -> Engine:
    return cast(Engine, store.engine)


def _sessions(store: Store) -> sessionmaker[Session]:
    return cast("sessionmaker[Session]", store.sessions)


def _inventory(i: int) -> dict[str, Any]:
    """Shaped like `minion inventory --json`, with what JSON text makes tricky: brackets and quotes in
    strings, non-ASCII, big and fractional numbers, empty containers."""
    return {
        "hostname": f"gpu-{i}",
        "cpu": {"physical_cores": 64, "threads": 128, "sockets": 2, "model": 'AMD EPYC "Milan" 7543'},
        "memory_total_bytes": 540_000_000_000 + i,
        "gpus": [
            {
                "pci_address": f"0000:{0x18 + g:02x}:00.0",
                "name": "AD102 [GeForce RTX 4090]",
                "vram_bytes": 25_757_220_864,
                "link": {"current_speed_gts": 16.0, "max_width": 16, "ratio": 0.1 + g},
                "sources": {"model": "nvml"},
            }
            for g in range(i % 4)
        ],
        "drives": [{"name": "nvme0n1", "model": "Samsung Ünïcode ✓", "size_bytes": 10**16}],
        "nics": [],
        "notes": ["line\\with backslash", "tab\there"],
    }


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"d": value}
    return value


def _seed(session: Session, count: int) -> None:
    providers.enable(session, "physical", {}, actor=ACTOR)
    regions.create(session, "lab-1", provider="physical", actor=ACTOR)
    now = datetime.now(UTC)
    for i in range(count):
        node = nodes.add(session, f"gpu-{i}", region="lab-1", minion_id=f"{0xFA000 + i:032x}", actor=ACTOR)
        if i % 5 == 0:
            continue  # never reported: no reports, offline
        at = now - timedelta(minutes=10) if i % 7 == 0 else now
        nodes.record_report(
            session, node, at=at, inventory=_inventory(i), requirements={"ok": True, "rules": []}
        )
        if i % 3 == 0:
            node.finalize_actual = {"state": "ok", "facts": {"scratch": ["/scratch"]}}
            node.finalize_retry = 2
            session.add(
                NodeAttestation(node_id=node.id, ek_sha256="e" * 64, ak_public=b"ak", last_quote_at=now)
            )
    session.flush()


def _store_legacy_reports(store: Store) -> None:
    """Reports as a control plane older than the bounds could have stored them (straight into the table)."""
    with _engine(store).begin() as db:
        for name, report in (("gpu-1", _deep(300)), ("gpu-2", {"blob": "x" * 40_000})):
            db.execute(
                text("UPDATE nodes SET inventory = :v WHERE name = :n"), {"v": json.dumps(report), "n": name}
            )


def _model_page(session: Session, rows: list[Any], cursor: str | None) -> Page[NodeOut]:
    """The page as the NodeOut model writes it, node by node from the ORM (what `node show` does)."""
    items = []
    for row in rows:
        node = nodes.get(session, row.id)
        out = NodeOut.of(node).readable()
        attested = {
            "last_quote_at": nodes.last_quote_at(session, node),
            "identity": nodes.identity(session, node),
        }
        items.append(out.model_copy(update=attested))
    return Page[NodeOut](items=items, next=cursor)


def test_a_fast_page_is_the_node_out_page(store: Store) -> None:
    with _sessions(store).begin() as s:
        _seed(s, 40)
    _store_legacy_reports(store)
    walked = 0
    with _sessions(store)() as s:
        after = None
        while True:
            rows, cursor = nodes.list_page(s, limit=15, after=after)
            fast = json.loads(nodes_page_json(rows, cursor))
            model = json.loads(_model_page(s, rows, cursor).model_dump_json())
            assert fast == model
            assert list(fast) == ["items", "next"]
            assert all(list(item) == list(ITEM_KEYS) for item in fast["items"])
            walked += len(rows)
            if cursor is None:
                break
            after = cursor
    assert walked == 40
    with _sessions(store)() as s:
        listed = {i["name"]: i for i in json.loads(nodes_page_json(*nodes.list_page(s, limit=500)))["items"]}
    assert listed["gpu-1"]["inventory"] == listed["gpu-2"]["inventory"] == UNREADABLE_REPORT
    assert listed["gpu-3"]["inventory"]["drives"][0]["model"] == "Samsung Ünïcode ✓"
    assert listed["gpu-3"]["last_quote_at"] is not None and listed["gpu-3"]["finalize_retry"] == 2
    assert listed["gpu-0"]["inventory"] is None and listed["gpu-0"]["online"] is False
    assert listed["gpu-7"]["online"] is False and listed["gpu-8"]["online"] is True


def test_a_stored_nan_never_reaches_a_client(store: Store) -> None:
    """Python's json writes NaN, which is not JSON: such a stored report is listed as unreadable."""
    if store.backend != "sqlite":
        pytest.skip("PostgreSQL's json type refuses NaN: only a SQLite store can hold one")
    with _sessions(store).begin() as s:
        _seed(s, 2)
    with _engine(store).begin() as db:
        db.execute(text("UPDATE nodes SET requirements = :v WHERE name = 'gpu-1'"), {"v": '{"ok": NaN}'})
    with _sessions(store)() as s:
        page = nodes_page_json(*nodes.list_page(s))

    def strict(constant: str) -> Any:
        raise AssertionError(f"{constant} in the page")

    items = json.loads(page, parse_constant=strict)["items"]
    assert next(i for i in items if i["name"] == "gpu-1")["requirements"] == UNREADABLE_REPORT


def test_a_page_is_one_query_whatever_its_size(store: Store) -> None:
    with _sessions(store).begin() as s:
        _seed(s, 60)
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(_engine(store), "before_cursor_execute", count)
    try:
        for limit in (5, 60):
            statements.clear()
            with _sessions(store)() as s:
                nodes_page_json(*nodes.list_page(s, limit=limit))
            selects = [st for st in statements if st.lstrip().upper().startswith("SELECT")]
            assert len(selects) == 1, selects
    finally:
        event.remove(_engine(store), "before_cursor_execute", count)
