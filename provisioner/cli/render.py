"""Output: Rich tables for people (ids and names are never truncated or wrapped), JSON or YAML for
machines. Human output goes to stdout; progress and questions go to stderr so `-o json` stays parseable.

The format is chosen once per command (`-o table|wide|json|yaml`, `--json`; common.output_options calls
`use`), so a command prints with `table(rows, COLUMNS, wide=WIDE)` / `detail(obj)` and never looks at it.
A default table fits FIT_WIDTH columns by shortening free text (reasons, GPU lists) with `…`; ids, names
and regions are never cut, and `-o wide` adds the `wide` columns and cuts nothing."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table

# wide enough that Rich never shortens a cell; tables do not expand, so this costs nothing
_WIDTH = 1000
FIT_WIDTH = 120  # what a default table fits in (a terminal of kubectl's habits)
_MIN_CUT = 8  # a shortened column keeps at least this many characters
_GAP = 2  # Rich's padding between columns (box=None)
_MIN_WRAP = 30  # a wrapped column is at least this wide, however wide the others are
# (field, header) or (field, header, how to show the row in that column)
Column = tuple[str, str] | tuple[str, str, Callable[[dict[str, Any]], str]]
Columns = Sequence[Column]


class Output(StrEnum):
    TABLE = "table"  # for people: fits FIT_WIDTH columns
    WIDE = "wide"  # the table with every column, nothing shortened
    JSON = "json"
    YAML = "yaml"


_output = Output.TABLE


def use(output: Output) -> None:
    """The format of this command's output (one command per process: set once, by output_options)."""
    global _output
    _output = output


def chosen(as_json: bool = False) -> Output:
    return Output.JSON if as_json else _output


def is_machine(as_json: bool = False) -> bool:
    """Whether this command prints JSON or YAML (rows exactly as the API gave them)."""
    return chosen(as_json) in (Output.JSON, Output.YAML)


def _is_time(field: str) -> bool:
    return field == "at" or field.endswith("_at")


def _never_cut(field: str) -> bool:
    """Ids and names are what an operator copies into the next command, and a cut time reads as another
    time: never shortened."""
    return field in {"id", "name", "region", "node", "minion_id"} or field.endswith("_id") or _is_time(field)


def _when(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def local_time(value: Any) -> str:
    """An ISO time in this machine's time zone, to the second (YYYY-MM-DD HH:MM:SS); `-` when none."""
    at = _when(value)
    return "-" if at is None else at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def human_bytes(count: float) -> str:
    """Bytes in binary units, three significant digits: 512B, 1.50KiB, 20.0MiB, 3.25GiB."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = 1 << {"TiB": 40, "GiB": 30, "MiB": 20, "KiB": 10}[unit]
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{int(count)}B"


def human_duration(seconds: float) -> str:
    """kubectl's short durations: 45s, 3m, 2h, 5d (the largest unit only)."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def ago(field: str) -> Callable[[dict[str, Any]], str]:
    """A column showing how long ago `field` (an ISO time) was: `3m`, `2h`; `-` when never."""

    def show(row: dict[str, Any]) -> str:
        at = _when(row.get(field))
        return "-" if at is None else human_duration((datetime.now(UTC) - at).total_seconds())

    return show


def until(field: str, never: str = "never") -> Callable[[dict[str, Any]], str]:
    """A column showing how long until `field` (an ISO time): `in 6d`, or `3h ago` once passed."""

    def show(row: dict[str, Any]) -> str:
        at = _when(row.get(field))
        if at is None:
            return never
        left = (at - datetime.now(UTC)).total_seconds()
        return f"in {human_duration(left)}" if left >= 0 else f"{human_duration(-left)} ago"

    return show


def gpu_summary(row: dict[str, Any]) -> str:
    """The GPUs of a node's inventory, counted by model: `4x RTX 4090`, `2x A100, 1x T4`; `-` unknown."""
    inventory = row.get("inventory")
    if not isinstance(inventory, dict) or not isinstance(inventory.get("gpus"), list):
        return "-"
    models = Counter(
        str(g.get("model") or g.get("name") or "GPU") for g in inventory["gpus"] if isinstance(g, dict)
    )
    return ", ".join(f"{n}x {model}" for model, n in models.most_common()) or "none"


def by_region_then_name(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order of every list of things that live in regions (kubectl sorts by namespace, then name)."""
    return sorted(rows, key=lambda r: (str(r.get("region") or ""), str(r.get("name") or r.get("id") or "")))


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


def print_yaml(data: Any) -> None:
    import yaml

    print(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=True).rstrip())


def machine(data: Any, output: Output) -> bool:
    """Print `data` as JSON or YAML when that is the chosen output; False when it is a table."""
    if output is Output.JSON:
        print_json(data)
    elif output is Output.YAML:
        print_yaml(data)
    else:
        return False
    return True


def _field_cell(field: str, value: Any) -> str:
    """A value as people read it: times in this machine's zone to the second (JSON keeps the API's)."""
    if _is_time(field) and isinstance(value, str) and _when(value) is not None:
        return local_time(value)
    return _cell(value)


def _show(row: dict[str, Any], column: Column) -> str:
    return column[2](row) if len(column) == 3 else _field_cell(column[0], row.get(column[0]))


def _width(cell: str) -> int:
    return max(len(line) for line in cell.split("\n"))


def _wrap(headers: list[str], cells: list[list[str]], wrapped: list[bool]) -> list[list[str]]:
    """Wrap the `wrapped` columns' text into what is left of FIT_WIDTH beside the other columns."""
    if not any(wrapped) or not cells:
        return cells
    others = sum(max(len(h), *(_width(r[i]) for r in cells)) for i, h in enumerate(headers) if not wrapped[i])
    room = max(_MIN_WRAP, (FIT_WIDTH - others - _GAP * (len(wrapped) - 1)) // sum(wrapped))
    return [
        [("\n".join(textwrap.wrap(c, room)) or c) if wrapped[i] else c for i, c in enumerate(row)]
        for row in cells
    ]


def _fit(headers: list[str], cells: list[list[str]], cuttable: list[bool]) -> list[list[str]]:
    """Shorten the widest cuttable column, one character at a time, until the table fits FIT_WIDTH."""
    widths = [max(len(h), *(_width(r[i]) for r in cells)) for i, h in enumerate(headers)]
    over = sum(widths) + _GAP * (len(widths) - 1) - FIT_WIDTH
    while over > 0:
        candidates = [
            i for i, cut in enumerate(cuttable) if cut and widths[i] > max(_MIN_CUT, len(headers[i]))
        ]
        if not candidates:
            break  # only ids and names are left: the table is wider, never an id shorter
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
        over -= 1
    return [
        [c if len(c) <= widths[i] or not cuttable[i] else c[: widths[i] - 1] + "…" for i, c in enumerate(row)]
        for row in cells
    ]


def table(
    rows: list[dict[str, Any]],
    columns: Columns,
    *,
    as_json: bool = False,
    wide: Columns = (),
    empty: str = "nothing yet",
    keep: Sequence[str] = (),
    wrap: Sequence[str] = (),
) -> None:
    """Rows as the chosen output: a table of `columns` (`-o wide` adds `wide`), or the rows as they are.
    `keep`: fields that are never shortened to fit, beside ids and names; `wrap`: fields whose text
    wraps onto more lines to fit instead."""
    output = chosen(as_json)
    if machine(rows, output):
        return
    if not rows:
        console().print(f"({empty})")
        return
    shown = [*columns, *wide] if output is Output.WIDE else list(columns)
    headers = [c[1] for c in shown]
    cells = [[_show(row, c) for c in shown] for row in rows]
    if output is Output.TABLE:
        cells = _wrap(headers, cells, [c[0] in wrap for c in shown])
        cells = _fit(headers, cells, [not (_never_cut(c[0]) or c[0] in keep or c[0] in wrap) for c in shown])
    t = Table(box=None, header_style="bold", pad_edge=False)
    for header in headers:
        t.add_column(header, no_wrap=True, overflow="ignore")
    for line in cells:
        t.add_row(*line)
    _print_table(t)


def detail(
    obj: dict[str, Any],
    *,
    as_json: bool = False,
    fields: Sequence[str] | None = None,
    nested: Sequence[str] = (),
) -> None:
    """One object as `field  value` lines (all fields, or `fields` in that order; `-o wide`: all).
    `nested`: fields holding an object, shown as one `field.key  value` line per key."""
    output = chosen(as_json)
    if machine(obj, output):
        return
    if output is Output.WIDE:
        fields = None
    lines: list[tuple[str, Any]] = []
    for field in fields or obj:
        value = obj.get(field)
        if field in nested and isinstance(value, dict) and value:
            lines += [(f"{field}.{key}", inner) for key, inner in value.items()]
        else:
            lines.append((field, value))
    t = Table(box=None, show_header=False, pad_edge=False)
    # a field's name is never cut, however long a value is (Rich would shrink the first column first)
    t.add_column(style="bold", no_wrap=True, min_width=max((len(f) for f, _ in lines), default=0))
    t.add_column(no_wrap=True, overflow="ignore")
    for field, value in lines:
        t.add_row(field, _field_cell(field, value))
    _print_table(t)


def created(obj: dict[str, Any], *, as_json: bool) -> None:
    """Creation prints the new id alone (so `ID=$(provision … create …)` works), or the object in JSON."""
    if not machine(obj, chosen(as_json)):
        print(obj["id"])
