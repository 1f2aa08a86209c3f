"""Accounts and projects, against the real `provision serve` and the real CLI: the first admin
token belongs to the root account `default` with its default project; the root admin creates an account and
its tokens (admin, member); each account sees only its own projects (another account's project answers 404
with the body of a missing one, for every project route); members manage projects but not tokens or
accounts; regions belong to the account that created them. Revision 0014 moves an older store's tokens
and regions to the root account, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.orm import Session

from contracts.jobs import USERNS_FIRST, USERNS_SIZE, UserNamespace
from provisioner.domain.roles import Principal, Role
from provisioner.services.accounts import accounts
from provisioner.store.migrate import alembic_config, upgrade
from tests.fixtures.control_plane import ControlPlane, start_control_plane

BEFORE = "0013_gcp_storage_node_no_copies"
REVISION = "0014_accounts_projects"


def _as(cp: ControlPlane, token: str) -> httpx.Client:
    client = cp.client()
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def _ok(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def _refused(cp: ControlPlane, exit_code: int, *args: str) -> str:
    """One line on stderr, the exit code, nothing on stdout."""
    out = cp.provision(*args)
    assert out.returncode == exit_code and out.stderr.count("\n") == 1 and not out.stdout, (args, out)
    return out.stderr


def _token(cp: ControlPlane, name: str, *options: str) -> str:
    token_id, secret = _ok(cp, "token", "create", name, *options).split()
    assert token_id.startswith("tok_") and secret.startswith("rbo_")
    return secret


@pytest.fixture(scope="module")
def two_accounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, dict[str, str]]]:
    """One server; the root admin (cp.token) creates account `acme` with an admin and a member token."""
    with start_control_plane(tmp_path_factory.mktemp("accounts") / "home") as cp:
        acme_id = _ok(cp, "account", "create", "acme").strip()
        assert acme_id.startswith("acc_")
        tokens = {
            "root": cp.token,
            "acme_id": acme_id,
            "acme_admin": _token(cp, "acme-admin", "--account", "acme", "--role", "admin"),
            "acme_member": _token(cp, "acme-dev", "--account", acme_id, "--role", "member"),
        }
        yield cp, tokens


def test_first_start_makes_the_root_account_and_its_default_project(
    two_accounts: tuple[ControlPlane, dict[str, str]],
) -> None:
    cp, _ = two_accounts
    accounts = {a["name"]: a for a in json.loads(_ok(cp, "account", "list", "--json"))}
    assert set(accounts) == {"default", "acme"}
    assert accounts["default"]["root"] and not accounts["acme"]["root"]
    (admin,) = [t for t in json.loads(_ok(cp, "token", "list", "--json")) if t["name"] == "admin"]
    assert admin["role"] == "admin" and admin["account_id"] == accounts["default"]["id"]
    (default,) = json.loads(_ok(cp, "project", "list", "--json"))
    assert (
        default["name"] == "default"
        and default["default"]
        and default["id"] == accounts["default"]["default_project"]
    )
    shown = json.loads(_ok(cp, "account", "show", "acme", "--json"))
    assert shown["id"] == accounts["acme"]["id"] and shown["default_project"].startswith("prj_")


def test_an_account_sees_only_its_own_projects(two_accounts: tuple[ControlPlane, dict[str, str]]) -> None:
    """Every project route, asked by another account for acme's project, answers exactly what it answers
    for a project that does not exist."""
    cp, t = two_accounts
    with _as(cp, t["acme_member"]) as member, _as(cp, t["root"]) as root:
        made = member.post("/v1/projects", json={"name": "vision", "description": "detectors"})
        assert made.status_code == 201, made.text
        project = made.json()
        assert project["account_id"] == t["acme_id"] and not project["default"]
        # the same name in another account is another project
        mine = root.post("/v1/projects", json={"name": "vision"})
        assert mine.status_code == 201 and mine.json()["id"] != project["id"]

        for ref in (project["id"], f"prj_{'0' * 16}"):
            for method in ("GET", "DELETE"):
                theirs = root.request(method, f"/v1/projects/{ref}")
                missing = root.request(method, f"/v1/projects/{ref}-gone")
                assert theirs.status_code == missing.status_code == 404, theirs.text
                assert theirs.json() == {
                    "code": missing.json()["code"],
                    "message": missing.json()["message"].replace(f"{ref}-gone", ref),
                }
        assert [p["name"] for p in root.get("/v1/projects").json()["items"]] == ["default", "vision"]
        listed = member.get("/v1/projects").json()["items"]
        assert {p["name"] for p in listed} == {"default", "vision"}
        assert all(p["account_id"] == t["acme_id"] for p in listed)
        # acme's project survived the other account's DELETE
        assert member.get(f"/v1/projects/{project['id']}").json()["name"] == "vision"


def test_roles_decide_tokens_and_accounts(two_accounts: tuple[ControlPlane, dict[str, str]]) -> None:
    cp, t = two_accounts
    with _as(cp, t["acme_member"]) as member, _as(cp, t["acme_admin"]) as admin:
        for method, path, body in (
            ("POST", "/v1/operator-tokens", {"name": "sneaky"}),
            ("GET", "/v1/operator-tokens", None),
            ("POST", "/v1/accounts", {"name": "evil"}),
        ):
            refused = member.request(method, path, json=body)
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden_role", refused.text
            assert "member token may not" in refused.json()["message"]
        # an account admin: its own account's tokens only, no new accounts, no other account's tokens
        made = admin.post("/v1/operator-tokens", json={"name": "acme-ci", "role": "member"})
        assert made.status_code == 201 and made.json()["account_id"] == t["acme_id"]
        names = {tok["name"] for tok in admin.get("/v1/operator-tokens").json()["items"]}
        assert names == {"acme-admin", "acme-dev", "acme-ci"}
        revoked = admin.delete("/v1/operator-tokens/acme-ci")  # not the fleet's last admin: no guard
        assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
        assert admin.get("/v1/operator-tokens/admin").status_code == 404  # the root's admin token
        assert admin.delete("/v1/operator-tokens/admin").status_code == 404
        assert admin.post("/v1/operator-tokens", json={"name": "x", "account": "default"}).status_code == 404
        assert admin.post("/v1/accounts", json={"name": "evil"}).status_code == 403
        assert [a["name"] for a in admin.get("/v1/accounts").json()["items"]] == ["acme"]
        assert admin.get("/v1/accounts/default").status_code == 404
    # the CLI: one line, exit 1 for a refusal, 2 for malformed input; nothing stored
    before = _ok(cp, "token", "list", "--json")
    assert "does not exist" in _refused(cp, 1, "token", "create", "y", "--account", "nope")
    assert "'owner' is not one of" in _refused(cp, 2, "token", "create", "y", "--role", "owner")
    assert "not a DNS label" in _refused(cp, 2, "account", "create", "Bad_Name")
    assert "already exists" in _refused(cp, 1, "account", "create", "acme")
    assert _ok(cp, "token", "list", "--json") == before


def test_project_commands(two_accounts: tuple[ControlPlane, dict[str, str]]) -> None:
    cp, _ = two_accounts
    project_id = _ok(cp, "project", "create", "speech", "-d", "ASR models").strip()
    assert project_id.startswith("prj_")
    shown = json.loads(_ok(cp, "project", "show", "speech", "--json"))
    assert (
        shown["id"] == project_id and shown["description"] == "ASR models" and shown["account"] == "default"
    )
    assert "speech" in _ok(cp, "project", "list")
    assert "already exists" in _refused(cp, 1, "project", "create", "speech")
    assert "not a DNS label" in _refused(cp, 2, "project", "create", "No Spaces")
    assert "default project" in _refused(cp, 1, "project", "remove", "default", "--yes")
    removed = json.loads(_ok(cp, "project", "remove", project_id, "--yes", "--json"))
    assert removed["removed_at"] and removed["name"] == "speech"
    assert "does not exist" in _refused(cp, 1, "project", "show", "speech")
    # a removed project's name can be used again: another project
    assert _ok(cp, "project", "create", "speech").strip() not in ("", project_id)


def test_a_projects_notebook_autostop_is_set_shown_and_refused_out_of_range(
    two_accounts: tuple[ControlPlane, dict[str, str]],
) -> None:
    cp, tokens = two_accounts
    _ok(cp, "project", "create", "notebooks", "--notebook-autostop", "15")
    assert json.loads(_ok(cp, "project", "show", "notebooks", "--json"))["notebook_autostop_minutes"] == 15
    said = _ok(cp, "project", "update", "notebooks", "--notebook-autostop", "0")
    assert said.strip() == "project notebooks: notebooks without an autostop of their own never autostop"
    back = json.loads(_ok(cp, "project", "update", "notebooks", "--default-notebook-autostop", "--json"))
    assert back["notebook_autostop_minutes"] is None
    assert "NOTEBOOK AUTOSTOP" in _ok(cp, "project", "list", "-o", "wide")
    assert "say one change" in _refused(cp, 2, "project", "update", "notebooks")
    assert "say one change" in _refused(
        cp, 2, "project", "update", "notebooks", "--notebook-autostop", "5", "--default-notebook-autostop"
    )
    assert "43200" in _refused(cp, 2, "project", "update", "notebooks", "--notebook-autostop", "50000")
    with _as(cp, cp.token) as http:  # the API refuses what the CLI would not send, and changes nothing
        refused = http.patch("/v1/projects/notebooks", json={"notebook_autostop_minutes": -1})
        assert refused.status_code == 422, refused.text
        assert http.patch("/v1/projects/notebooks", json={}).status_code == 422
        assert http.get("/v1/projects/notebooks").json()["notebook_autostop_minutes"] is None
    with _as(cp, tokens["acme_admin"]) as http:  # another account's project is not there to change
        assert http.patch("/v1/projects/notebooks", json={"notebook_autostop_minutes": 5}).status_code == 404
    reasons = _sql(
        sa.create_engine(cp.database_url),
        "SELECT reason FROM audit_events WHERE resource_kind = 'project' AND resource_name = 'notebooks'",
    )
    assert [r[0] for r in reasons] == [
        "created",
        "notebook autostop: never",
        "notebook autostop: the built-in default",
    ]


def test_regions_belong_to_the_account_that_created_them(
    two_accounts: tuple[ControlPlane, dict[str, str]],
) -> None:
    cp, t = two_accounts
    with _as(cp, t["root"]) as root, _as(cp, t["acme_admin"]) as admin:
        assert root.post("/v1/providers", json={"kind": "physical", "config": {}}).status_code == 201
        ours = root.post("/v1/regions", json={"name": "hq", "provider": "physical"})
        theirs = admin.post("/v1/regions", json={"name": "acme-lab", "provider": "physical"})
        assert ours.status_code == theirs.status_code == 201, (ours.text, theirs.text)
        root_id = root.get("/v1/accounts/default").json()["id"]
        assert ours.json()["account_id"] == root_id and theirs.json()["account_id"] == t["acme_id"]


def _sql(engine: sa.Engine, statement: str) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(sa.text(statement))
        return list(result.all()) if result.returns_rows else []


def test_migration_gives_an_older_stores_tokens_and_regions_to_the_root_account(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    cfg = alembic_config(database_url)

    def migrate(step: Any, target: str) -> None:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            step(cfg, target)

    migrate(command.upgrade, BEFORE)
    now = "CURRENT_TIMESTAMP"
    _sql(
        engine,
        "INSERT INTO providers (id, kind, payment_mode, state, public_config, created_at, updated_at, "
        f"version) VALUES ('prv_1', 'physical', 'owned', 'enabled', '{{}}', {now}, {now}, 1)",
    )
    _sql(
        engine,
        "INSERT INTO regions (id, name, provider_id, storage_mode, public_jobs, state, settings, created_at, "
        f"updated_at, version) VALUES ('reg_1', 'old', 'prv_1', 'local', TRUE, 'active', '{{}}', {now}, "
        f"{now}, 1)",
    )
    for name in ("admin", "robot"):
        _sql(
            engine,
            "INSERT INTO api_tokens (id, name, role, token_sha256, created_at) "
            f"VALUES ('tok_{name}', '{name}', 'admin', '{name:0>64}', {now})",
        )
    upgrade(database_url, engine)

    ((account_id, name, root, uid_slot),) = _sql(engine, "SELECT id, name, root, uid_slot FROM accounts")
    assert name == "default" and root and account_id.startswith("acc_")
    assert uid_slot == 0  # the first user namespace range on the nodes (contracts.jobs.UserNamespace)
    ((project_account, project_name, default),) = _sql(
        engine, "SELECT account_id, name, is_default FROM projects"
    )
    assert (project_account, project_name, default) == (account_id, "default", True)
    assert {r[0] for r in _sql(engine, "SELECT account_id FROM api_tokens")} == {account_id}
    assert _sql(engine, "SELECT account_id FROM regions") == [(account_id,)]

    # and back down to where it came from, keeping the rows
    migrate(command.downgrade, BEFORE)
    assert "account_id" not in {c["name"] for c in sa.inspect(engine).get_columns("api_tokens")}
    assert "accounts" not in sa.inspect(engine).get_table_names()
    assert len(_sql(engine, "SELECT id FROM api_tokens")) == 2
    engine.dispose()


def test_new_tables_hold_names_unique_per_account(tmp_path: Path) -> None:
    """The database itself refuses a second live project of one name in an account, and a second default
    project (two API workers racing past the service's check)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    ((account_id,),) = _sql(engine, "SELECT id FROM accounts")
    for name, is_default in (("default", 0), ("other", 1)):
        with pytest.raises(sa.exc.IntegrityError):
            _sql(
                engine,
                "INSERT INTO projects (id, account_id, name, is_default, created_at) "
                f"VALUES ('prj_x', '{account_id}', '{name}', {is_default}, CURRENT_TIMESTAMP)",
            )
    engine.dispose()


def test_a_project_ref_with_a_newline_is_not_found_not_405(
    two_accounts: tuple[ControlPlane, dict[str, str]],
) -> None:
    """A decoded ref may hold a newline (found by fuzzing): GET and share still reach their routes and
    answer the missing project's 404, not the undocumented 405 of `DELETE /{ref}`."""
    cp, _ = two_accounts
    with cp.client() as c:
        for method, path, body in [
            ("GET", "/v1/projects/a%0Ab", None),
            ("GET", "/v1/projects/default/a%0Ab", None),
            ("POST", "/v1/projects/a%0Ab/shares", {"account": "default"}),
        ]:
            answer = c.request(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
            assert answer.json()["code"] == "project_not_found", answer.text


def test_each_account_gets_a_user_namespace_range_of_its_own(tmp_path: Path) -> None:
    """Tenancy finding 6: every account's containers map their uids onto the account's own host range
    (contracts.jobs.UserNamespace), so the next account never gets a range an account already has."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    ((root_id,),) = _sql(engine, "SELECT id FROM accounts")
    root = Principal(actor="operator:test", account_id=root_id, role=Role.ADMIN, root=True)
    with Session(engine) as session, session.begin():
        made = [accounts.create(session, root, name).uid_slot for name in ("acme", "globex")]
    assert made == [1, 2]
    ranges = [UserNamespace.of_slot(slot) for slot in (0, *made)]
    assert [r.first for r in ranges] == [USERNS_FIRST + n * USERNS_SIZE for n in range(3)]
    with pytest.raises(sa.exc.IntegrityError):  # the store refuses a range twice (two creations racing)
        _sql(engine, f"UPDATE accounts SET uid_slot = 1 WHERE id = '{root_id}'")
    engine.dispose()
