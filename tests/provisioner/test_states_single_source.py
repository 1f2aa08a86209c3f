"""Every lifecycle state is spelled once, in provisioner/domain/states.py.

An AST scan of provisioner/ (the domain module and the alembic migrations excepted) fails when a state
value is written as a string literal where code decides or records a state: a comparison with a
`state`/`status` expression, an assignment to such a name or attribute (or keyword, or dict key), a
`where`/`filter` clause, a dict keyed by states, or a module constant aliasing a state. Messages are
never matched: a sentence is not equal to a state value, and f-strings are not looked into."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import pytest

from provisioner.domain import states

ROOT = Path(__file__).resolve().parents[2] / "provisioner"
EXCLUDED = (ROOT / "domain", ROOT / "store" / "migrations")

# The lifecycle enums: every enum with a transition table, plus the observed / derived ones.
LIFECYCLES: tuple[type[StrEnum], ...] = (*states.TABLES, states.ActualState, states.JoinOutcome)
VALUES: frozenset[str] = frozenset(s.value for enum in LIFECYCLES for s in enum)
CLAUSES = {"where", "filter", "filter_by", "having"}


def _stateish(name: str | None) -> bool:
    return name is not None and ("state" in name.lower() or "status" in name.lower())


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # row["state"], or rows[0].state
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return _name_of(node.value)
    if isinstance(node, ast.Call):  # row.get("state"), func(x).state
        key = node.args[0] if node.args else None
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return _name_of(node.func)
    return None


def _literals(node: ast.AST | None) -> Iterator[ast.Constant]:
    """State literals a value can evaluate to: the constant itself, a collection's items, both branches."""
    if node is None:
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in VALUES:
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _literals(item)
    elif isinstance(node, ast.IfExp):
        yield from _literals(node.body)
        yield from _literals(node.orelse)
    elif isinstance(node, ast.Call) and _name_of(node.func) in {"frozenset", "set", "tuple", "list"}:
        for arg in node.args:
            yield from _literals(arg)


def _hits(tree: ast.Module) -> Iterator[tuple[int, str]]:  # noqa: C901
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_stateish(_name_of(side)) for side in sides):
                for side in sides:
                    for lit in _literals(side):
                        yield lit.lineno, f"compares a state with {lit.value!r}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = _name_of(target)
                found = list(_literals(node.value))
                # a module constant naming a state: REMOVED = "removed"
                alias = id(node) in module_level and any(name == str(lit.value).upper() for lit in found)
                if _stateish(name) or alias:
                    for lit in found:
                        yield lit.lineno, f"assigns {lit.value!r} to {name}"
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if _stateish(kw.arg):
                    for lit in _literals(kw.value):
                        yield lit.lineno, f"passes {lit.value!r} as {kw.arg}="
            if isinstance(node.func, ast.Attribute) and node.func.attr in CLAUSES:
                for arg in [*node.args, *(kw.value for kw in node.keywords)]:
                    for sub in ast.walk(arg):
                        if isinstance(sub, ast.Constant) and sub.value in VALUES:
                            yield sub.lineno, f"filters on {sub.value!r}"
        elif (
            isinstance(node, (ast.Set, ast.Tuple, ast.List))
            and node.elts
            and all(isinstance(item, ast.Constant) and item.value in VALUES for item in node.elts)
        ):
            # a group of states anywhere: DONE = {"ready"}, poll(done={"enabled"}), x in ("new", "active")
            yield node.lineno, f"groups states {[getattr(i, 'value', None) for i in node.elts]}"
        elif isinstance(node, ast.Dict):
            keyed = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in VALUES]
            if len(keyed) >= 2:
                yield node.lineno, f"a dict keyed by states {[k.value for k in keyed]}"
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and _stateish(key.value):
                    for lit in _literals(value):
                        yield lit.lineno, f"puts {lit.value!r} under {key.value!r}"
        elif isinstance(node, ast.Match) and _stateish(_name_of(node.subject)):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue):
                        for lit in _literals(sub.value):
                            yield lit.lineno, f"matches a state against {lit.value!r}"


def scan(source: str) -> list[tuple[int, str]]:
    return sorted(set(_hits(ast.parse(source))))


def _files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not any(p.is_relative_to(ex) for ex in EXCLUDED))


def test_no_state_is_spelled_outside_the_domain() -> None:
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {what}"
        for path in _files()
        for line, what in scan(path.read_text())
    ]
    assert not found, "use the enums of provisioner/domain/states.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'if node.state == "removed": pass',
        'if region.state in ("removing", "removed"): pass',
        'row.status = "deleting"',
        'state: str = "trusted"',
        'audit.record(s, to_state="revoked")',
        'out = {"state": "pending"}',
        'q = select(Node).where(Node.service == "storage", Node.state != "removed")',
        'REMOVED = "removed"',
        'READY_STATES = {"maintenance", "active"}',
        'VM_DONE = {"ready"}',
        'poll(client, done={"enabled"}, failed={"errored", "removed"})',
        'failed = st["region"]["state"] == "errored" and "failed"',
        'x = "revoked" if t.revoked_at else "issued"\nresult = {"status": x if x else "refused"}',
        'COLOURS = {"errored": "red", "active": "green"}',
        'match node.state:\n    case "errored": pass',
    ],
)
def test_the_scan_catches(source: str) -> None:
    assert scan(source), source


@pytest.mark.parametrize(
    "source",
    [
        'raise Conflict("the node is removed: add it again", code="conflict")',
        'if "error" in box: pass',
        'print(f"{node.name} is {node.state}")',
        'log.info("failed")',
        'class Outcome(StrEnum):\n    FAILED = "failed"',
        "q = select(Node).where(Node.state != NodeState.REMOVED)",
        "NOT_REMOVED = text(\"state != 'removed'\")",
        'PARTS = ("ready", "set", "go")',
    ],
)
def test_the_scan_leaves_alone(source: str) -> None:
    assert not scan(source), source


@pytest.mark.parametrize("enum", list(states.TABLES))
def test_every_table_covers_its_enum(enum: type[StrEnum]) -> None:
    table = states.TABLES[enum]
    assert set(table) == set(enum), f"{enum.__name__}: states without a row: {set(enum) - set(table)}"
    for source, targets in table.items():
        assert all(isinstance(t, enum) for t in targets), f"{enum.__name__}.{source.name} leaves its enum"


def test_named_sets_are_subsets_of_their_enums() -> None:
    assert states.NODE_READY <= set(states.NodeState)
    assert states.NODE_SCHEDULABLE <= states.NODE_READY
    assert states.NODE_STOPPED <= set(states.NodeState)
    assert not states.NODE_READY & states.NODE_STOPPED
    assert states.REGION_LEAVING <= set(states.RegionState)
    assert states.REGION_SETTLED_BAD <= set(states.RegionState)
    assert states.PROVIDER_FAILED_OR_GONE <= set(states.ProviderState)
    every = {s for enum in states.TABLES for s in enum}
    assert states.KEEPS_REASON <= every
    assert states.TERMINAL <= every
    for enum, table in states.TABLES.items():
        finals = {s for s, out in table.items() if not out}
        assert finals, f"{enum.__name__} has no final state"
        assert finals <= states.TERMINAL


def test_actual_state_extends_what_nodes_report() -> None:
    from contracts.regional import ReportedState

    assert {s.value for s in ReportedState} | {states.ActualState.PENDING.value} == {
        s.value for s in states.ActualState
    }


class _Session:
    """Just enough of a Session for `lifecycle.apply`: collects the audit lines."""

    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, row: object) -> None:
        self.added.append(row)

    def flush(self) -> None:
        pass


def test_vm_status_changes_are_checked_and_audited() -> None:
    from types import SimpleNamespace

    from sqlalchemy.orm import Session

    from contracts.errors import RuleViolation
    from provisioner.services.common import lifecycle

    rec, session = SimpleNamespace(status=states.VmStatus.PENDING.value, region_id="reg_1"), _Session()

    def move(to: states.VmStatus) -> None:
        lifecycle.apply(
            cast(Session, session),
            rec,
            to,
            kind="storage_vm",
            name="vm-1",
            table=states.VM_TRANSITIONS,
            actor="test",
            reason="insert sent",
            column="status",
            resource_id=rec.region_id,
        )

    move(states.VmStatus.CREATING)
    assert rec.status == states.VmStatus.CREATING
    [event] = session.added
    assert (event.from_state, event.to_state, event.resource_id) == ("pending", "creating", "reg_1")
    with pytest.raises(RuleViolation, match="cannot go to ready"):
        move(states.VmStatus.READY)
