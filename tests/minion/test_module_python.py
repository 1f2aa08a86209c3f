"""The interpreter a node's finalize runs Ansible modules with (minion/finalize/module_python.py), through
the real ansible-playbook with the local connection and pipelining (as the minion's runner runs it), with
the launcher the image builder ships (image_builder.node_ansible.module_python). A module run by it loads
the installed, byte-compiled `ansible.module_utils`; run by a plain Python, the payload zip's copy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible  # type: ignore[import-untyped]
import pytest

from contracts.finalize import MODULE_PYTHON
from minion.finalize.runner import inventory_for, module_interpreter
from tests.minion.finalize_helpers import local_play_env, write_module_python

PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

# reports which file `ansible.module_utils.basic` was loaded from in the module's process
WHEREAMI = """#!/usr/bin/python
from ansible.module_utils import basic
from ansible.module_utils.basic import AnsibleModule

AnsibleModule(argument_spec={}).exit_json(changed=False, basic=basic.__file__)
"""

PLAY = """- hosts: node
  gather_facts: false
  tasks:
    - name: where module_utils come from
      whereami:
      register: where
    - name: a directory
      ansible.builtin.file: {{path: "{d}/made", state: directory}}
    - name: a copy
      ansible.builtin.copy: {{content: "x\\n", dest: "{d}/made/x"}}
    - name: a failing module
      ansible.builtin.file: {{path: "{d}/missing/deeper", state: file}}
      ignore_errors: true
      register: failing
    - ansible.builtin.copy:
        content: "{{{{ {{'basic': where.basic, 'failed': failing.failed, 'msg': failing.msg}} | to_json }}}}"
        dest: "{d}/result.json"
"""


def _play(tmp_path: Path, interpreter: str) -> dict[str, Any]:
    d = tmp_path / interpreter.replace("/", "_")
    (d / "library").mkdir(parents=True)
    (d / "library" / "whereami.py").write_text(WHEREAMI)
    (d / "play.yml").write_text(PLAY.format(d=d))
    (d / "inventory.json").write_text(json.dumps(inventory_for(None, interpreter)))
    env = {**local_play_env(d), "ANSIBLE_LIBRARY": str(d / "library")}
    out = subprocess.run(
        [str(PLAYBOOK), "-i", str(d / "inventory.json"), str(d / "play.yml")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert (d / "made" / "x").read_text() == "x\n"
    result: dict[str, Any] = json.loads((d / "result.json").read_text())
    return result


def test_modules_load_the_installed_module_utils_and_still_report_changes_and_failures(
    tmp_path: Path,
) -> None:
    installed = Path(ansible.__file__).parent / "module_utils" / "basic.py"
    ours = _play(tmp_path, str(write_module_python(tmp_path / "bin")))
    assert Path(ours["basic"]) == installed
    assert ours["failed"] is True and "missing" in ours["msg"], ours
    # a plain Python takes them from the payload's zip, compiled anew at every task
    plain = _play(tmp_path, sys.executable)
    assert ".zip" in plain["basic"] and Path(plain["basic"]) != installed
    assert plain["failed"] is True


def test_the_module_python_is_found_on_path_or_beside_the_minion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = write_module_python(tmp_path / "bin")
    assert module_interpreter(str(launcher.parent)) == str(launcher)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere" / "minion")])
    assert module_interpreter(str(tmp_path)) == sys.executable  # nowhere: this Python, as before
    monkeypatch.setattr(sys, "argv", [str(launcher.parent / "minion")])
    assert module_interpreter(str(tmp_path)) == str(launcher)
    assert launcher.name == MODULE_PYTHON
