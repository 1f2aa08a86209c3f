"""Before creating anything: does the service account hold what rigbase needs?

Asks Resource Manager's projects.testIamPermissions (REST; it answers with the subset the caller holds)
and names what is missing in docs/product-rules.md's words — the roles an operator grants in the console —
rather than in raw permission strings. Where the call is not offered (Resource Manager API disabled,
or a server without it) the report says so and the operator is told which roles to check by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

# role (as docs/product-rules.md "Google Cloud provider" names it) -> the permissions of it that rigbase uses
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "Compute Admin": (
        "compute.regions.get",
        "compute.instances.create",
        "compute.instances.get",
        "compute.instances.delete",
        "compute.instances.getShieldedInstanceIdentity",
        "compute.instances.setMetadata",
        "compute.instances.setLabels",
        "compute.firewalls.create",
        "compute.firewalls.get",
        "compute.firewalls.delete",
        "compute.zoneOperations.get",
        "compute.globalOperations.get",
    ),
    "Pub/Sub Admin": (
        "pubsub.topics.create",
        "pubsub.topics.get",
        "pubsub.topics.delete",
        "pubsub.topics.getIamPolicy",
        "pubsub.topics.setIamPolicy",
        "pubsub.subscriptions.create",
        "pubsub.subscriptions.get",
        "pubsub.subscriptions.delete",
        "pubsub.subscriptions.consume",
    ),
    "Logs Configuration Writer": ("logging.sinks.create", "logging.sinks.get", "logging.sinks.delete"),
    "Service Account User": ("iam.serviceAccounts.actAs",),
}
ALL_PERMISSIONS: tuple[str, ...] = tuple(p for perms in ROLE_PERMISSIONS.values() for p in perms)


@dataclass(frozen=True)
class PermissionReport:
    checked: bool  # False when testIamPermissions was not offered
    missing_permissions: tuple[str, ...] = ()
    missing_roles: tuple[str, ...] = ()
    note: str = ""
    granted: frozenset[str] = field(default_factory=frozenset)

    @property
    def ok(self) -> bool:
        return self.checked and not self.missing_roles

    def message(self, client_email: str) -> str:
        """One sentence for the operator."""
        if not self.checked:
            return (
                f"could not check permissions ({self.note}): make sure {client_email} has the roles "
                f"{', '.join(ROLE_PERMISSIONS)} before continuing"
            )
        if self.missing_roles:
            return (
                f"{client_email} lacks {', '.join(self.missing_roles)} "
                f"({len(self.missing_permissions)} permissions, e.g. {self.missing_permissions[0]}): "
                "grant these roles in IAM & Admin > IAM and enable the provider again"
            )
        return f"{client_email} holds every permission rigbase needs"


def roles_missing(granted: set[str] | frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(missing roles, missing permissions) for a set of granted permissions; pure, for tests."""
    missing_perms = tuple(p for p in ALL_PERMISSIONS if p not in granted)
    missing_roles = tuple(
        role for role, perms in ROLE_PERMISSIONS.items() if any(p in missing_perms for p in perms)
    )
    return missing_roles, missing_perms


def check(ctx: GcpContext) -> PermissionReport:
    url = f"{ctx.resource_manager_url}/v1/projects/{ctx.project}:testIamPermissions"
    try:
        resp = ctx.http.post(url, json={"permissions": list(ALL_PERMISSIONS)}, timeout=30)
    except (
        Exception
    ) as exc:  # requests' ConnectionError, Timeout, TransportError…: all mean "not offered here"
        return PermissionReport(checked=False, note=f"{type(exc).__name__} reaching Resource Manager")
    if resp.status_code in (403, 404, 501):
        # 403 here is "Resource Manager API disabled / not allowed to test", not a missing role of ours
        return PermissionReport(
            checked=False, note=f"projects.testIamPermissions answered HTTP {resp.status_code}"
        )
    if resp.status_code != 200:
        return PermissionReport(
            checked=False, note=f"projects.testIamPermissions answered HTTP {resp.status_code}"
        )
    granted = frozenset(resp.json().get("permissions", []))
    missing_roles, missing_perms = roles_missing(granted)
    return PermissionReport(
        checked=True, missing_permissions=missing_perms, missing_roles=missing_roles, granted=granted
    )
