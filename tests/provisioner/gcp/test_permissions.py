"""testIamPermissions → missing permissions named as roles (docs/product-rules.md "Google Cloud provider")."""

from __future__ import annotations

from typing import Any

from provisioner.providers.gcp import permissions
from provisioner.providers.gcp.permissions import ALL_PERMISSIONS, ROLE_PERMISSIONS


def test_all_granted(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.granted_permissions = set(ALL_PERMISSIONS)
    report = permissions.check(compute_ctx)
    assert report.ok and report.missing_roles == ()
    assert "holds every permission" in report.message("sa@p.iam.gserviceaccount.com")


def test_missing_roles_are_named(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.granted_permissions = set(ROLE_PERMISSIONS["Compute Admin"]) | {"logging.sinks.get"}
    report = permissions.check(compute_ctx)
    assert report.checked and not report.ok
    assert report.missing_roles == ("Pub/Sub Admin", "Logs Configuration Writer", "Service Account User")
    msg = report.message("sa@p.iam.gserviceaccount.com")
    assert msg.startswith(
        "sa@p.iam.gserviceaccount.com lacks Pub/Sub Admin, Logs Configuration Writer, Service Account User"
    )
    assert "\n" not in msg


def test_not_offered_is_explained(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.granted_permissions = None  # the fake answers 404, like a disabled API
    report = permissions.check(compute_ctx)
    assert not report.checked and "HTTP 404" in report.note
    msg = report.message("sa@p")
    assert "Compute Admin, Pub/Sub Admin, Logs Configuration Writer, Service Account User" in msg


def test_unreachable_is_explained() -> None:
    from provisioner.providers.gcp.clients import Endpoints, GcpContext

    ctx = GcpContext.anonymous("p", Endpoints(resource_manager="http://127.0.0.1:9"))
    report = permissions.check(ctx)
    assert not report.checked and "ConnectionError" in report.note


def test_role_table_matches_product_rules() -> None:
    assert list(ROLE_PERMISSIONS) == [
        "Compute Admin",
        "Pub/Sub Admin",
        "Logs Configuration Writer",
        "Service Account User",
    ]
