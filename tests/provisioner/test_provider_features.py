"""Services ask a provider driver what it supports (providers/base.py Feature), as SkyPilot asks a cloud,
and never branch on a provider's name: a new provider is a driver with its features, not an edit of every
service that knew "gcp"."""

from __future__ import annotations

import ast
from pathlib import Path

from provisioner.providers.base import REGISTRY, Feature, kinds_supporting, provider_for

SERVICES = Path(__file__).resolve().parents[2] / "provisioner" / "services"


def test_each_driver_says_what_it_supports() -> None:
    assert not any(provider_for("physical").supports(f) for f in Feature)
    assert all(provider_for("gcp").supports(f) for f in Feature)
    assert kinds_supporting(Feature.QUOTA) == ("gcp",)


def _name_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Provider kinds written as strings where code compares or keys on them."""
    kinds = set(REGISTRY)
    found = []
    for node in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Assign):
            operands = [node.value]
        for op in operands:
            elements = op.elts if isinstance(op, ast.Tuple | ast.List | ast.Set) else [op]
            for e in elements:
                if isinstance(e, ast.Constant) and e.value in kinds:
                    found.append((e.lineno, e.value))
    return found


def test_no_service_branches_on_a_providers_name() -> None:
    offenders = [
        f"{path.relative_to(SERVICES)}:{line}: {kind!r}"
        for path in sorted(SERVICES.rglob("*.py"))
        for line, kind in _name_literals(ast.parse(path.read_text()))
    ]
    assert not offenders, "ask the driver `supports(Feature.…)` instead:\n" + "\n".join(offenders)


def test_the_scan_sees_a_name_compared() -> None:
    tree = ast.parse('if kind == "gcp": pass\nWORK = {"gcp": 1}\nKIND = "physical"\n')
    assert sorted(_name_literals(tree)) == [(1, "gcp"), (2, "gcp"), (3, "physical")]
