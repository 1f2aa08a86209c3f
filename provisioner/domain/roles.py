"""Who may do what: the roles of operator tokens and the actions each allows, as data (docs/accounts.md).

Every operator token belongs to one account and has one role in it. The root account (created at first
start, named `default`) runs the fleet: its admins administer every account. Everyone else acts only
inside their own account: another account's resources answer 404, as a missing one would."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contracts.errors import Forbidden


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    # reads GET /metrics and nothing else (a Prometheus server's credential; root account only)
    SCRAPE = "scrape"


class Action(StrEnum):
    MANAGE_ACCOUNTS = "create accounts and other accounts' tokens"
    MANAGE_TOKENS = "create, rotate and revoke operator tokens"
    MANAGE_PROJECTS = "create and remove projects"
    SHARE_PROJECTS = "share projects with other accounts"
    RUN_JOBS = "create and stop jobs"
    SELL_CAPACITY = "sell a region's spare capacity to public jobs"
    MANAGE_FLEET = (
        "create regions and change a region's nodes, datastores, reservations, join tokens, images "
        "and device configurations"
    )
    MANAGE_TRUST = (
        "change the fleet's trust roots (TPM vendor CAs, image-builder keys), providers and rejections"
    )


# The roles that may take each action within their own account ...
ALLOWED: dict[Action, frozenset[Role]] = {
    Action.MANAGE_ACCOUNTS: frozenset({Role.ADMIN}),
    Action.MANAGE_TOKENS: frozenset({Role.ADMIN}),
    Action.MANAGE_PROJECTS: frozenset({Role.ADMIN, Role.MEMBER}),
    # lets another account's jobs use this account's regions, datastores and reservations: admins decide
    Action.SHARE_PROJECTS: frozenset({Role.ADMIN}),
    Action.RUN_JOBS: frozenset({Role.ADMIN, Role.MEMBER}),
    # other accounts' jobs then run on the account's machines, paid for in credits: admins decide
    Action.SELL_CAPACITY: frozenset({Role.ADMIN}),
    # a region belongs to its account: its members see it (read-only), its admins manage it
    Action.MANAGE_FLEET: frozenset({Role.ADMIN}),
    # a trust root or a provider is trusted (or spends) for every region of every account
    Action.MANAGE_TRUST: frozenset({Role.ADMIN}),
}
# ... and the actions that reach beyond it, so only the root account's admins take them
ROOT_ONLY: frozenset[Action] = frozenset({Action.MANAGE_ACCOUNTS, Action.MANAGE_TRUST})


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the audit-trail actor (`operator:<token name>`), its account and role.
    `root`: the account is the root account (its admins may act on every account)."""

    actor: str
    account_id: str
    role: str
    root: bool = False

    @property
    def is_fleet_admin(self) -> bool:
        return self.root and self.role == Role.ADMIN

    def may(self, action: Action) -> bool:
        if action in ROOT_ONLY and not self.root:
            return False
        return Role(self.role) in ALLOWED[action]

    def require(self, action: Action) -> None:
        """Forbidden (403), in one line naming the role that may, unless this principal may."""
        if self.may(action):
            return
        who = "an admin token of the root account" if action in ROOT_ONLY else "an admin token"
        raise Forbidden(
            f"a {self.role} token may not {action.value}: ask for {who} (docs/accounts.md)",
            code="forbidden_role",
        )

    def account_scope(self) -> str | None:
        """The account whose rows this principal sees, or None for every account (fleet admins)."""
        return None if self.is_fleet_admin else self.account_id


def refuse_scrape_token(role: str) -> None:
    """A scrape token reads GET /metrics only: every other route and the console refuse it (403)."""
    if role == Role.SCRAPE:
        raise Forbidden(
            "a scrape token reads GET /metrics only: use an operator token (`provision token create`)",
            code="forbidden_role",
        )
