"""What a node needs to run its own finalize playbook locally: the Ansible collections the playbooks use,
and launchers for the console scripts of the pinned ansible-core / ansible-runner wheels
(wheel.NODE_REQUIREMENTS). No apt and no network fetch on a node: the playbooks themselves come from the
control plane as a bundle (the minion saves it on the state partition); everything else ships in the image.

The collections come from the build host's venv (`<venv>/ansible-collections`, unpacked there by
scripts/install-deps.sh and used by the control plane's own runner), so the node runs the same collection
version the control plane's tests run."""

from __future__ import annotations

import hashlib
import json
import sys
from configparser import ConfigParser
from pathlib import Path

from contracts.finalize import MODULE_PYTHON, MODULE_PYTHON_ENTRY
from image_builder.errors import BuildError

#: Where the node finds them; the minion units export the path (node_files.ANSIBLE_ENV).
NODE_COLLECTIONS = "/usr/lib/rigbase/ansible-collections"
NODE_BIN = "/usr/local/bin"

#: The collections the playbooks use (`namespace/name` under ansible_collections/).
COLLECTIONS: tuple[str, ...] = ("community/general",)

#: Distributions whose console scripts get a launcher on the node (ansible-runner runs `ansible-playbook`
#: from PATH).
SCRIPT_DISTS: tuple[str, ...] = ("ansible_core", "ansible_runner")


def host_collections(prefix: Path | None = None) -> Path:
    """The build host's collections root (the directory holding `ansible_collections/`)."""
    return (prefix or Path(sys.prefix)) / "ansible-collections"


def collection_files(root: Path) -> dict[str, Path]:
    """Relative path (under ansible_collections/) → host file, for every shipped collection; sorted.
    Byte-compiled files are skipped: they carry the host's timestamps."""
    out: dict[str, Path] = {}
    for coll in COLLECTIONS:
        base = root / "ansible_collections" / coll
        if not (base / "MANIFEST.json").is_file():
            raise BuildError(
                f"the Ansible collection {coll.replace('/', '.')} is missing from {root}; "
                "run scripts/install-deps.sh."
            )
        for p in sorted(base.rglob("*")):
            if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts:
                out[str(p.relative_to(root))] = p
    return dict(sorted(out.items()))


def collection_versions(root: Path) -> dict[str, str]:
    """`namespace.name` → version, from each collection's MANIFEST.json (for the image manifest)."""
    versions: dict[str, str] = {}
    for coll in COLLECTIONS:
        info = json.loads((root / "ansible_collections" / coll / "MANIFEST.json").read_text())
        versions[coll.replace("/", ".")] = str(info["collection_info"]["version"])
    return versions


def files_digest(files: dict[str, Path]) -> str:
    md = hashlib.sha256()
    for rel, path in files.items():
        md.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return md.hexdigest()


def console_scripts(
    site: Path, *, python: str = "/usr/bin/python3", site_on_node: str = "/usr/lib/rigbase/python"
) -> dict[str, str]:
    """Script name → launcher text for the console scripts of SCRIPT_DISTS, read from the unpacked
    wheels' entry_points.txt in `site` (on the node: `site_on_node`, run by `python`)."""
    scripts: dict[str, str] = {}
    for info in sorted(site.glob("*.dist-info/entry_points.txt")):
        dist = info.parent.name.split("-", 1)[0].lower().replace("-", "_")
        if dist not in SCRIPT_DISTS:
            continue
        parser = ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # script names are case-sensitive
        parser.read_string(info.read_text())
        if not parser.has_section("console_scripts"):
            continue
        for name, target in sorted(parser.items("console_scripts")):
            module, _, func = target.partition(":")
            scripts[name] = launcher(module.strip(), func.strip(), python=python, site=site_on_node)
    return scripts


def module_python(
    *, python: str = "/usr/bin/python3", site: str = "/usr/lib/rigbase/python"
) -> dict[str, str]:
    """The launcher of the interpreter the node's finalize runs Ansible modules with (contracts.finalize
    MODULE_PYTHON): with it, modules load the byte-compiled module_utils of the image instead of compiling
    their payload's copy at every task."""
    module, func = MODULE_PYTHON_ENTRY
    return {MODULE_PYTHON: launcher(module, func, python=python, site=site)}


def launcher(
    module: str, func: str, *, python: str = "/usr/bin/python3", site: str = "/usr/lib/rigbase/python"
) -> str:
    """A console-script launcher for the image's python3 with the pinned wheels first on sys.path (what
    pip would write, plus the path: the wheels live outside Debian's dist-packages)."""
    return (
        f"#!{python}\n"
        "import sys\n"
        f'sys.path.insert(0, "{site}")\n'
        f"from {module} import {func.split('.')[0]}\n"
        f"sys.exit({func}())\n"
    )
