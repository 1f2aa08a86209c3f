"""Byte-compiled Python on the node's root.

The root is read-only (dm-verity), so Python can never write a __pycache__ there: without bytecode in the
image, every Python process on a node (the minion at each start, `ansible-playbook`, and each Ansible module
it runs) compiles everything it imports from source, every time: most of a finalize's time on a slow CPU,
and about half of it natively (docs/image-builder.md, "Bytecode").

So the stage is compiled here, in the tree's own interpreter (chroot), into hash-based pycs (PEP 552) that
carry no timestamps. Unchecked: Python trusts them without reading the source, which is right on a root
that nothing can change without changing its verity hash (and so the node's PCRs). Reproducible: one
process, in sorted order (marshal's reference flags depend on what the compiling process has seen), with a
fixed hash seed (set constants are written in hash order)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

from image_builder import rootfs, wheel
from image_builder.errors import BuildError

#: Where the node imports Python from: the standard library (its versioned directory is found in the tree),
#: Debian's packages and this repository's node packages, the minion's dependencies.
SEARCH: Final = ("usr/lib/python3/dist-packages", wheel.NODE_SITE)
# PYTHONDONTWRITEBYTECODE: else the compiling interpreter caches its own imports (argparse, ...) first as
# timestamp pycs, which compileall then takes for up to date (-f rewrites whatever is there anyway).
ENV: Final = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def python_dirs(root: Path) -> list[str]:
    """The directories to compile, as paths inside `root`."""
    stdlib = sorted(p.name for p in (root / "usr/lib").glob("python3.[0-9]*") if p.is_dir())
    if not stdlib:
        raise BuildError(
            f"{root} has no usr/lib/python3.X; rebuild the base tree (remove the cache's rootfs)"
        )
    return [f"/usr/lib/{name}" for name in stdlib] + [f"/{d}" for d in SEARCH if (root / d).is_dir()]


def compile_tree(root: Path) -> None:
    """Write unchecked hash-based pycs for every module under the node's Python directories."""
    dirs = python_dirs(root)
    argv = [
        "/usr/bin/python3",
        "-m",
        "compileall",
        "-q",
        "-f",
        "-j",
        "1",
        "--invalidation-mode",
        "unchecked-hash",
    ]
    try:
        rootfs.chroot(root, *argv, *dirs, env=ENV)
    except subprocess.CalledProcessError as exc:
        failed = (exc.stdout or exc.stderr or "").strip().splitlines()[-3:]
        raise BuildError(f"byte-compiling the node's Python failed: {' / '.join(failed)}") from None
