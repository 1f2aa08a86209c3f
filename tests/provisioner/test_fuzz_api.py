"""Schemathesis against the real `provision serve`: every operation of /openapi.json, operator and minion
routes alike, with valid credentials of the right kind (operator token, node credential, join token), on a
store seeded with real data — a region with an attested node (real swtpm), a pending minion, a
reservation, a datastore, a join token, an operator token — so path parameters reach real resources instead
of only ever answering 404. Checks: no server error, and every status code, content type and body is the
one the OpenAPI document declares. A bounded number of examples per operation keeps it a CI test."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from provisioner.lab.swtpm import VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.finalize import current_work
from tests.provisioner.test_join_http import Minion, api

# per operation; about 80 operations. The examples differ from run to run; the deeper hunt of
# `make test-deep` (150) found two 500s that 20 had missed in a dozen CI runs.
EXAMPLES = int(os.environ.get("RIGBASE_FUZZ_EXAMPLES", "10"))
STATEFUL_EXAMPLES = 25  # scenarios of up to 6 linked calls
HEALTH = list(HealthCheck)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class World:
    cp: ControlPlane
    node_id: str
    node_credential: str
    join_token: str
    # path template → a value of its parameter that names a seeded resource
    refs: dict[str, str] = field(default_factory=dict)

    def credential(self, operation: Any) -> str:
        schemes = {name for req in operation.definition.raw.get("security", []) for name in req}
        if "nodeCredential" in schemes:
            return self.node_credential
        if "joinToken" in schemes:
            return self.join_token
        return self.cp.token


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA, _golden_swtpm: Any
) -> Iterator[World]:
    from tests.fixtures.swtpm import _started_copy

    home = tmp_path_factory.mktemp("fuzz") / "home"
    # Schemathesis also sends requests without the Authorization header (401, as documented), and every
    # one spends from loopback's failed-authentication budget: with the default budget the rest of a run
    # would meet 429s whose timing, not the generated choices, decides what a scenario can do next. The
    # limiter has its own tests (tests/provisioner/test_limits_http.py); here it must not interfere.
    unlimited = {"RIGBASE_AUTH_FAILURES_BURST": "1000000", "RIGBASE_JOIN_ATTEMPTS_BURST": "1000000"}
    # No reconciler runs: the API's contract is what is fuzzed, and a fuzzed dataset's source (s3://…,
    # https://…) is never read, so nothing leaves this machine and no pass changes the store between
    # the stateful scenarios' snapshots.
    unlimited["RIGBASE_RECONCILERS"] = "false"
    with start_control_plane(home, env=unlimited) as cp:
        api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
        api(cp, "POST", "/v1/regions", {"name": "lab", "provider": "physical"})
        api(cp, "POST", "/v1/tpm-cas", {"pem": b"".join(tpm_vendor_ca.certificate_pems()).decode()})
        join_token = api(cp, "POST", "/v1/regions/lab/join-tokens", {"ttl": "1h"})["token"]
        minions = [
            Minion(_started_copy(_golden_swtpm(tpm_vendor_ca, 40 + i), home.parent / f"tpm{i}"), cp.url)
            for i in range(2)
        ]
        api(cp, "POST", "/v1/nodes", {"name": "gpu-1", "region": "lab", "minion_id": minions[0].minion_id})
        joined = minions[0].join(join_token)
        assert joined.status_code == 200, joined.text
        pending = minions[1].join(join_token)  # attested, no node added: a pending minion
        assert pending.status_code == 202, pending.text
        api(cp, "POST", "/v1/reservations", {"name": "nb", "region": "lab", "hostname": "nb", "port": 8888})
        api(
            cp,
            "POST",
            "/v1/datastores",
            {"name": "share", "region": "lab", "type": "nfs", "address": "10.0.0.5", "root": "/export"},
        )
        api(cp, "POST", "/v1/operator-tokens", {"name": "victim"})
        api(cp, "POST", "/v1/projects", {"name": "ml"})
        job = {"name": "fuzzed", "resources": {"gpu_types": ["T4"], "gpu_count": 1}, "workers": ["true"]}
        api(cp, "POST", "/v1/jobs", {"spec": job})  # waits: no active node
        node = joined.json()
        work = current_work(cp.url, node["node_id"], node["node_credential"])
        refs = {
            "/v1/finalize/bundles/{digest}": work["bundle_digest"],
            "/v1/providers/{ref}": "physical",
            "/v1/regions/{ref}": "lab",
            "/v1/nodes/{ref}": "gpu-1",
            "/v1/reservations/{ref}": "nb",
            "/v1/datastores/{ref}": "share",
            "/v1/operator-tokens/{ref}": "victim",  # never the admin token the fuzzer authenticates with
            "/v1/projects/{ref}": "ml",
            "/v1/jobs/{ref}": "fuzzed",
            "/v1/accounts/{ref}": "default",
            "/v1/nodes/{node_id}": node["node_id"],
        }
        try:
            yield World(cp, node["node_id"], node["node_credential"], join_token, refs)
        finally:
            for m in minions:
                m.close()
                m.tpm.stop()  # its swtpm copy is this fixture's to stop


@pytest.fixture(scope="module")
def fuzz_schema(world: World) -> Any:
    schema = schemathesis.openapi.from_url(f"{world.cp.url}/openapi.json", verify=str(world.cp.ca))

    calls: Counter[str] = Counter()

    @schema.hook  # type: ignore[misc]
    def map_path_parameters(ctx: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        """Every other example of an operation names a seeded resource; the rest stay random (404 paths).
        Counted, not hashed: str hashes change per process, and ten examples could all miss the seed."""
        if not path_parameters or ctx.operation is None:
            return path_parameters
        path = ctx.operation.path
        calls[path] += 1
        for prefix, value in world.refs.items():
            param = prefix.rsplit("{", 1)[1].rstrip("}")
            if path.startswith(prefix) and param in path_parameters and calls[path] % 2:
                path_parameters[param] = value
        return path_parameters

    return schema


def _fuzz(operation: Any, auth: dict[str, str], ca: str) -> set[int]:
    """Fuzz one operation; the statuses it answered."""
    seen: set[int] = set()

    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH, database=None)
    def run(case: Any) -> None:
        seen.add(case.call_and_validate(headers=auth, checks=CHECKS, verify=ca).status_code)

    run()
    return seen


def test_every_operation_keeps_its_documented_contract(fuzz_schema: Any, world: World) -> None:
    """Each operation in turn, with hypothesis driving the examples (schemathesis' Python API, not its
    pytest plugin, whose lazy fixtures do not run on pytest 9). All failures are collected, then shown."""
    failures: list[str] = []
    # reads first, then writes, removals last: a fuzzed DELETE of the seeded region must not leave the
    # reads with nothing to reach
    order = {"GET": 0, "POST": 1, "DELETE": 2}
    operations = sorted(
        (result.ok() for result in fuzz_schema.get_all_operations()),
        key=lambda op: order.get(op.method.upper(), 1),
    )
    assert len(operations) > 50

    reached: dict[str, set[int]] = {}
    for operation in operations:
        try:
            auth = {"Authorization": f"Bearer {world.credential(operation)}"}
            reached[operation.label] = _fuzz(operation, auth, str(world.cp.ca))
        except (Exception, BaseExceptionGroup) as exc:  # collected: one report for every failing operation
            failures.append(f"{operation.label}: {' '.join(str(exc).split())[:600]}")
    assert not failures, "\n".join(failures)
    # the seeding works: operations on a seeded resource reached past "not found"
    for template in world.refs:
        for label, statuses in reached.items():
            if label.split(" ", 1)[1] == template and label.startswith("GET"):
                assert statuses - {404, 422}, f"{label} only answered {sorted(statuses)}"


def test_stateful_runs_chain_create_read_act_delete(fuzz_schema: Any, world: World) -> None:
    """Schemathesis' state machine follows the document's OpenAPI links (provisioner/api/links.py): the id a
    create answers feeds the reads, actions and removal of what it created, with the same checks."""
    links = [
        name
        for item in fuzz_schema.raw_schema["paths"].values()
        for op in item.values()
        for name in op.get("responses", {}).get("201", {}).get("links", {})
    ]
    assert len(links) >= 20, links

    # Every scenario starts from the same store. Hypothesis models the system under test as stateless: when
    # it meets a choice prefix again it expects the same rules to be enabled, but a create that answered
    # 201 in an earlier scenario would answer 409 for the same generated name in a later one, its link's
    # bundle would stay empty, and hypothesis would stop with FlakyStrategyDefinition. (What CI hit was
    # the 429s above; this second cause was not seen to fail a run, and is closed anyway.) Restoring the
    # snapshot (SQLite's online backup, into the live file the server keeps open) before each scenario
    # rules it out.
    db = Path(world.cp.database_url.removeprefix("sqlite:///"))
    snapshot = sqlite3.connect(":memory:")
    with closing(sqlite3.connect(db, timeout=30)) as live:
        live.backup(snapshot)

    class Machine(fuzz_schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            with closing(sqlite3.connect(db, timeout=30)) as live:
                snapshot.backup(live)
            # the object store too (the seeded world holds no object): a chunk an earlier scenario put
            # would change what a later one's upload answers
            shutil.rmtree(world.cp.home / "objects", ignore_errors=True)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            auth = {"Authorization": f"Bearer {world.credential(case.operation)}"}
            return {"headers": auth, "verify": str(world.cp.ca)}

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    run = settings(
        max_examples=STATEFUL_EXAMPLES,
        stateful_step_count=6,
        deadline=None,
        # generate only (no replay, no shrinking: a CI test's budget) and derandomized: every run explores
        # the same sequence, so the outcome does not depend on the run's seed
        phases=[Phase.generate],
        derandomize=True,
        suppress_health_check=HEALTH,
        database=None,
    )
    try:
        Machine.run(settings=run)
    finally:
        snapshot.close()
