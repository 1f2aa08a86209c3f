"""The Python a node's finalize runs Ansible modules with (`rigbase-ansible-python`, shipped in the image
beside the ansible-core launchers; runner.module_interpreter finds it).

Every module task starts a Python process that Ansible hands an AnsiballZ wrapper: a zip of the module and
the `ansible.module_utils` it imports, put first on sys.path. Python never caches the bytecode of what it
imports from a zip, so each task compiled `module_utils.basic` and its ~40 imports from source again: two
thirds of a module run, and on a slow CPU (a Jetson, a TCG guest) tens of seconds per task.

Python imports a package's submodules from the package's own directory (`__path__`), not from sys.path.
This interpreter finds the package `ansible.module_utils` in the installed ansible-core, byte-compiled when
the image was built: every `ansible.module_utils` import below it then loads that bytecode. The rest of
`ansible` still comes from the payload's zip: the module itself (`ansible.modules.*`, `ansible.legacy.*`,
which exists only there) and any collection's module_utils. The files are the same: the controller
(`ansible-playbook`, from the same installation) built the payload from them.

Invoked as Ansible invokes an interpreter: with the wrapper on stdin (pipelining, what the runner sets) or
with the wrapper's path as the first argument."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import runpy
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

PACKAGE = "ansible.module_utils"


class InstalledModuleUtils(importlib.abc.MetaPathFinder):
    """Finds `ansible.module_utils` in `directory` (the installed `ansible` package) whatever the parent's
    path says; its submodules follow from the package it returns."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.directory])


def install() -> None:
    """Put the finder first, for the installed ansible-core on sys.path (nothing imported yet)."""
    spec = importlib.util.find_spec("ansible")
    if spec is not None and spec.submodule_search_locations:
        sys.meta_path.insert(0, InstalledModuleUtils(list(spec.submodule_search_locations)[0]))


def main() -> None:
    install()
    if len(sys.argv) > 1:
        path = sys.argv[1]
        sys.argv = sys.argv[1:]
        runpy.run_path(path, run_name="__main__")
        return
    source = sys.stdin.buffer.read()
    # run as the script Ansible sent: its own globals, named __main__ (it checks __name__ to start)
    exec(compile(source, "<stdin>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
