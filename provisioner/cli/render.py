"""Output: Rich tables for people (ids and names are never truncated or wrapped), JSON for machines.
Human output goes to stdout; progress and questions go to stderr so `--json` stays parseable."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# wide enough that Rich never shortens a cell; tables do not expand, so this costs nothing
_WIDTH = 1000
Columns = Sequence[tuple[str, str]]  # (field, header)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True) if value else "-"
    return str(value)


def console() -> Console:
    return Console(width=_WIDTH, soft_wrap=True)


def _print_table(t: Table) -> None:
    """Print without the padding Rich adds after the last column, so output pastes and diffs cleanly."""
    con = console()
    with con.capture() as captured:
        con.print(t)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(rows: list[dict[str, Any]], columns: Columns, *, as_json: bool, empty: str = "nothing yet") -> None:
    if as_json:
        print_json(rows)
        return
    if not rows:
        console().print(f"({empty})")
        return
    t = Table(box=None, header_style="bold", pad_edge=False)
    for _, header in columns:
        t.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        t.add_row(*(_cell(row.get(field)) for field, _ in columns))
    _print_table(t)


def detail(obj: dict[str, Any], *, as_json: bool, fields: Sequence[str] | None = None) -> None:
    """One object as `field  value` lines (all fields, or `fields` in that order)."""
    if as_json:
        print_json(obj)
        return
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(no_wrap=True, overflow="ignore")
    for field in fields or list(obj):
        t.add_row(field, _cell(obj.get(field)))
    _print_table(t)


def created(obj: dict[str, Any], *, as_json: bool) -> None:
    """Creation prints the new id alone (so `ID=$(provision … create …)` works), or the object in JSON."""
    if as_json:
        print_json(obj)
    else:
        print(obj["id"])
