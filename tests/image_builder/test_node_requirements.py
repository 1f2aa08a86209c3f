"""The node's Python (image_builder/wheel.py NODE_REQUIREMENTS) holds every third-party module the node's
packages import: the minion, the contracts and the builder's node files. A module missing there is a
minion that dies at `minion run` on every node booted from the image, which only a VM boot would
otherwise show (the job-URL tunnel's `websockets` was: tests/image_builder/test_vagrant_join.py found it)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from image_builder.wheel import NODE_PACKAGES, NODE_REQUIREMENTS

REPO = Path(__file__).resolve().parents[2]
OURS = {"minion", "contracts", "image_builder", "__future__"}


def _imports(root: Path) -> dict[str, str]:
    """Top-level third-party module → one file that imports it."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OURS:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def _closure(names: tuple[str, ...]) -> set[str]:
    """The distributions `names` install, their dependencies included (as pip resolves the wheelhouse)."""
    seen: set[str] = set()
    todo = [n.lower() for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(name) or []
        except PackageNotFoundError:  # a dependency for other Pythons (a marker): nothing imports it here
            continue
        for req in needs:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower())
    return {s.replace("_", "-") for s in seen}


def test_every_module_the_node_imports_is_in_its_wheelhouse() -> None:
    roots = [REPO / p.rstrip("/") for p in NODE_PACKAGES if (REPO / p).is_dir()]
    roots.append(REPO / "image-builder" / "image_builder")
    shipped = _closure(NODE_REQUIREMENTS)
    distributions = packages_distributions()
    missing = [
        f"{module} ({where})"
        for root in roots
        for module, where in _imports(root).items()
        if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & shipped
    ]
    assert not missing, f"add their distributions to NODE_REQUIREMENTS (image_builder/wheel.py): {missing}"
