"""GET /v1/nodes as JSON: a page of NodeOut (provisioner/api/schemas.py) written without decoding the reports.

A node's reports (inventory, requirements, finalize_actual, object_cache, gpu_health) are most of its
bytes — ~6 KiB of a realistic 8-GPU node — and the store already holds them as JSON text. Decoding and
re-encoding them was most of what a listed node cost. So list rows carry the reports' stored text
(provisioner/services/fleet/nodes.py LIST_COLUMNS), the other fields are serialised by pydantic-core in one
call with a marker where each report goes, and the stored text is spliced in at the markers. The answer
is the NodeOut page's JSON: same keys in the same order, same values; only the whitespace inside a report
is as stored.

Reports stored before they were bounded (contracts/messages.py) may be deeper or longer than a report may
be: those show as UNREADABLE_REPORT, as in `node show`. Checking a report means decoding it, so a report
text found within bounds is remembered by its hash (Python's per-process keyed hash: nobody can aim a
collision at it) and not checked again; unchanged reports — nearly all of them — cost one hash per list."""

from __future__ import annotations

import json
import operator
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import pydantic_core

from contracts.messages import bounded_report
from provisioner.api.schemas import UNREADABLE_REPORT, NodeOut
from provisioner.domain.states import is_online

# NodeOut's fields, in its order (the page's keys), and the list row column each is read from where the
# name differs (provisioner/services/fleet/nodes.py list_page). Reports are read as their stored text.
ITEM_KEYS: Final = tuple(NodeOut.model_fields)
SOURCE: Final = {
    "region": "region_name",
    "online": "last_heartbeat_at",  # derived below
    "inventory": "inventory_json",
    "requirements": "requirements_json",
    "finalize_actual": "finalize_actual_json",
    "object_cache": "object_cache_json",
    "gpu_health": "gpu_health_json",
}
REPORTS: Final = ("inventory", "requirements", "finalize_actual", "object_cache", "gpu_health")
_UNREADABLE_JSON: Final = json.dumps(UNREADABLE_REPORT, separators=(",", ":"))
# Hashes of report texts found within bounds: three reports of 60,000 nodes in ~15 MB. Past this it starts
# over (the next lists check again).
_CHECKED_MAX: Final = 200_000
_checked: set[int] = set()


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")  # Python's json writes NaN/Infinity; clients refuse them


def report_json(stored: str | None) -> str:
    """The JSON a report's stored text is listed as: itself when it is a report within bounds."""
    if stored is None or stored == "null":
        return "null"
    key = hash(stored)
    if key in _checked:
        return stored
    try:
        bounded_report(json.loads(stored, parse_constant=_not_json))
    except (ValueError, TypeError, RecursionError):
        return _UNREADABLE_JSON
    if len(_checked) >= _CHECKED_MAX:
        _checked.clear()
    _checked.add(key)
    return stored


def nodes_page_json(rows: Sequence[Any], next_cursor: str | None) -> str:
    """The page {"items": [NodeOut...], "next": cursor} as JSON, from list_page rows."""
    # A fresh random marker per page: no stored string can contain it, so every split is at a marker.
    marker = f"\x00{secrets.token_hex(8)}\x00"
    now = datetime.now(UTC)
    reports: list[str] = []
    items = []
    if rows:
        fields = rows[0]._fields
        # one C call per row picks its values in ITEM_KEYS order (attribute access on a Row is slow)
        pick = operator.itemgetter(*(fields.index(SOURCE.get(key, key)) for key in ITEM_KEYS))
        online, retry = ITEM_KEYS.index("online"), ITEM_KEYS.index("finalize_retry")
        at_reports = [ITEM_KEYS.index(key) for key in REPORTS]
        for row in rows:
            values = list(pick(row))
            values[online] = is_online(values[online], now)
            values[retry] = values[retry] or 0
            for i in at_reports:
                reports.append(report_json(values[i]))
                values[i] = marker
            items.append(dict(zip(ITEM_KEYS, values, strict=True)))
    head = pydantic_core.to_json({"items": items, "next": next_cursor}).decode()
    parts = head.split(pydantic_core.to_json(marker).decode())
    if len(parts) != len(reports) + 1:  # cannot happen (see above); never splice in the wrong place
        raise RuntimeError("node page: report markers do not match the reports")
    out = [parts[0]]
    for report, part in zip(reports, parts[1:], strict=True):
        out += (report, part)
    return "".join(out)
