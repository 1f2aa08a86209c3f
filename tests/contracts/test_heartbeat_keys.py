"""The heartbeat's keys are one contract (contracts/heartbeat_keys.py, contracts/heartbeat.py): every key
has a model for its desired and its actual value, whole answers and requests with every key filled
round-trip byte-identical through those models, both programs list exactly the contract's keys, and no
code names a key the contract does not define."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from contracts.heartbeat import ACTUAL, DESIRED, UnknownKey, dump, parse_actual, parse_desired
from contracts.heartbeat_keys import HeartbeatKey
from contracts.messages import HeartbeatRequest, HeartbeatResponse

ROOT = Path(__file__).resolve().parents[2]
WIRE = Path(__file__).parent / "wire_v1"


def compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def test_every_key_has_a_desired_and_an_actual_model() -> None:
    assert set(DESIRED) == set(ACTUAL) == set(HeartbeatKey)


def test_a_whole_answer_with_every_key_filled_round_trips_byte_identical() -> None:
    recorded = (WIRE / "heartbeat_response_full.json").read_bytes()
    answer = HeartbeatResponse.model_validate_json(recorded)
    assert answer.model_dump_json().encode() == recorded
    typed = parse_desired(answer.desired)
    assert set(typed) == set(HeartbeatKey)
    assert all(value not in (None, [], {}) for value in typed.values() if not isinstance(value, bool))
    again = {key.value: dump("desired", key, value) for key, value in typed.items()}
    assert compact(again) == compact(answer.desired)


def test_a_whole_report_with_every_key_filled_round_trips_byte_identical() -> None:
    recorded = (WIRE / "heartbeat_request_full.json").read_bytes()
    request = HeartbeatRequest.model_validate_json(recorded)
    assert compact(request.to_wire()) == recorded
    typed = parse_actual(request.actual)
    assert set(typed) == set(HeartbeatKey)
    again = {key.value: dump("actual", key, value) for key, value in typed.items()}
    assert compact(again) == compact(request.actual)


def test_a_key_the_contract_does_not_define_is_refused_on_both_sides() -> None:
    with pytest.raises(UnknownKey, match="'gpus'"):
        parse_desired({"maintenance": True, "gpus": []})
    with pytest.raises(UnknownKey, match="'gpus'"):
        parse_actual({"gpus": []})
    from minion import desired

    with pytest.raises(TypeError, match="HeartbeatKey"):
        desired.register("gpus", lambda value: value)  # type: ignore[arg-type]
    # a key a newer control plane sends is left alone by this minion, not handled and not echoed
    assert desired.apply({"gpus": [1]}) == {}


def test_the_control_plane_lists_every_key_and_only_the_contracts() -> None:
    from provisioner.services import beat

    assert list(beat.CONTRIBUTORS) == [HeartbeatKey(k) for k in beat.CONTRIBUTORS]
    assert set(beat.CONTRIBUTORS) == set(HeartbeatKey)
    assert set(beat.REPORTERS) <= set(HeartbeatKey)
    # `upnp` before `reservations`: the minion builds its reservations agent with the node's setting
    keys = list(beat.CONTRIBUTORS)
    assert keys.index(HeartbeatKey.UPNP) < keys.index(HeartbeatKey.RESERVATIONS)


def test_the_minions_run_hooks_register_through_the_one_registry() -> None:
    """Each hook module registers its handlers with desired.register and nothing else touches the table."""
    from minion.join.run import RUN_HOOKS

    for module in RUN_HOOKS:
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert "desired.register(HeartbeatKey." in source, module


# Names under which code holds a heartbeat's desired or actual values.
_HOLDERS = {"desired", "actual", "reported_desired", "reported_actual"}


def _holder(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in _HOLDERS


def _literal_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) for every heartbeat key written as a string: desired["x"], actual.get("x"),
    desired.register("x", …)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _holder(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.append((node.lineno, key.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if literal and (
                (node.func.attr in {"get", "pop", "setdefault"} and _holder(node.func.value))
                or node.func.attr == "register"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "desired"
            ):
                found.append((node.lineno, first.value))  # type: ignore[union-attr]
    return found


def test_no_code_names_a_heartbeat_key_outside_the_contract() -> None:
    """A key is named as a HeartbeatKey member: a string, even of a defined key, bypasses the contract
    (and one of an undefined key is a key the other side never reads)."""
    offenders = []
    for package in ("provisioner", "minion", "contracts", "image-builder/image_builder"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, key in _literal_keys(ast.parse(path.read_text())):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {key!r}")
    assert not offenders, (
        "name heartbeat keys as contracts.heartbeat_keys.HeartbeatKey members:\n" + "\n".join(offenders)
    )


def test_the_scan_sees_a_literal_key() -> None:
    """The scan above is not vacuous: each form it forbids is found."""
    tree = ast.parse('desired["gpus"]\nbody.actual.get("gpus")\ndesired.register("gpus", f)\n')
    assert _literal_keys(tree) == [(1, "gpus"), (2, "gpus"), (3, "gpus")]
