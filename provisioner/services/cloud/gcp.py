"""The Google Cloud provider's operator actions: enable (with permission check), quota, region create
(with capacity check and the storage node record), and what `--wait` shows. Each records the operator's
intent in the store and wakes the reconciler that does the slow work (provisioner/reconcilers/gcp.py);
the provider itself (provisioner/providers/gcp/) talks to Google."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, RuleViolation
from contracts.regional import StorageMode
from provisioner.adapters import tls
from provisioner.domain.states import VM_TRANSITIONS, ProviderState, Service, VmStatus
from provisioner.providers.gcp import GcpContext, GcpProvider, naming, permissions, quota
from provisioner.providers.gcp import images as gcp_images
from provisioner.services.common import lifecycle, names
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import join_tokens
from provisioner.services.fleet import nodes as node_service
from provisioner.services.regions import providers as provider_service
from provisioner.services.regions import regions as region_service
from provisioner.store.gcp_models import GcpBootstrap, GcpStorageNode
from provisioner.store.models import Node, Provider, Region

KIND = GcpProvider.kind
VM_KIND = "storage_vm"  # audit kind of a storage node VM's status changes


def driver(session: Session) -> GcpProvider:
    """The GCP driver of this control plane (its catalogue, and in tests the endpoints of local fakes)."""
    impl = runtime_of(session).provider(KIND)
    if not isinstance(impl, GcpProvider):
        raise TypeError(f"the runtime's '{KIND}' driver is a {type(impl).__name__}, not a GcpProvider")
    return impl


def context_of(session: Session, provider: Provider) -> GcpContext:
    """Google clients for the provider's project (quota checks made while the operator waits)."""
    return driver(session).context(provider_service.config_of(session, provider))


def enabled_provider(session: Session) -> Provider:
    prov = provider_service.get(session, KIND)
    if prov.state != ProviderState.ENABLED:
        raise Conflict(
            f"provider 'gcp' is {prov.state}, not enabled: wait for it (`provision provider show gcp`) "
            f"or see its reason",
            code="provider_not_enabled",
        )
    return prov


def enable(session: Session, raw: Mapping[str, Any], *, dry_run: bool, actor: str) -> dict[str, Any]:
    """Validate the key (no network), check permissions (testIamPermissions), then — unless dry_run —
    record the provider `new`; the bootstrap reconciler creates the project resources and enables it.
    Refusals store nothing."""
    impl = driver(session)
    config = impl.validate_config(raw)
    if not dry_run and session.scalar(
        select(Provider.id).where(Provider.kind == KIND, Provider.state != ProviderState.REMOVED)
    ):
        raise Conflict("provider 'gcp' is already enabled: see `provision provider show gcp`")
    report = permissions.check(impl.context(config))
    email = config.public["client_email"]
    if report.checked and report.missing_roles:
        raise RuleViolation(report.message(email), code="missing_roles")
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "project_id": config.public["project_id"],
        "client_email": email,
        "prefix": config.public["prefix"],
        "permissions": {
            "checked": report.checked,
            "missing_roles": list(report.missing_roles),
            "message": report.message(email),
        },
        "plan": [asdict(a) for a in impl.plan_enable(config)],
        "provider": None,
    }
    if dry_run:
        return out
    provider = provider_service.enable(session, KIND, raw, actor=actor)
    session.add(
        GcpBootstrap(provider_id=provider.id, progress="waiting for the bootstrap reconciler", created=[])
    )
    out["provider"] = provider
    return out


def bootstrap_status(session: Session) -> dict[str, Any]:
    """The provider and its bootstrap/teardown progress: what `provider enable gcp --wait` shows."""
    prov = provider_service.get(session, KIND)
    row = session.get(GcpBootstrap, prov.id)
    return {
        "provider": prov,
        "progress": row.progress if row else None,
        "created": list(row.created) if row else [],
    }


def region_quota(session: Session, gcp_region: str) -> quota.RegionQuota:
    ctx = context_of(session, enabled_provider(session))
    return quota.fetch(ctx, gcp_region, driver(session).catalogue())


def storage_node_name(prefix: str, region: str) -> str:
    """The node's name is its VM's name, so `node list` and the Cloud console agree."""
    return naming.gcp_name(prefix, "storage", region)


def pending_minion_id(region_id: str) -> str:
    """A placeholder until the vTPM's EK is known (minion_id is derived from the EK): unique per region,
    and never a real minion's id (no EK hashes to a value we choose)."""
    return hashlib.sha256(f"rigbase-gcp-pending:{region_id}".encode()).hexdigest()[:32]


def create_region(
    session: Session,
    name: str,
    *,
    gcp_region: str | None,
    storage_class: str,
    public_jobs: bool,
    dry_run: bool,
    actor: str,
) -> dict[str, Any]:
    """Refuse regions outside the catalogue or without GPU capacity; record the region (central storage)
    and its storage node (`new`, VM status pending). The storage-node reconciler makes the VM."""
    names.dns_label("region", name)
    prov = enabled_provider(session)
    impl = driver(session)
    options = {"gcp_region": gcp_region or name, "storage_class": storage_class}
    settings = impl.validate_region(name, options)  # refuses regions outside the catalogue
    prefix = prov.public_config.get("prefix", naming.DEFAULT_PREFIX)
    rq = quota.fetch(context_of(session, prov), settings["gcp_region"], impl.catalogue())
    if not rq.runnable:
        raise RuleViolation(rq.why_not_runnable(), code="no_gpu_capacity")
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "quota": rq.to_json(),
        "plan": [asdict(a) for a in impl.plan_region(name, {**settings, "prefix": prefix})],
        "region": None,
        "node": None,
    }
    if dry_run:
        return out
    region = region_service.create(
        session,
        name,
        provider=prov.id,
        storage_mode=StorageMode.CENTRAL.value,
        public_jobs=public_jobs,
        options=options,
        actor=actor,
    )
    region.settings = {**region.settings, "prefix": prefix}
    node = node_service.add_vm_node(
        session,
        region,
        storage_node_name(prefix, name),
        minion_id=pending_minion_id(region.id),
        service=Service.STORAGE,
        actor=actor,
        reason="storage node of a GCP region: the reconciler creates its VM; "
        "its minion_id comes from the vTPM's endorsement key",
    )
    _row, token = join_tokens.issue(session, region.id, actor=actor)  # verified by the join like any bundle's
    rec = GcpStorageNode(
        region_id=region.id,
        node_id=node.id,
        node=node,
        running=False,
        # a new region has no image yet: it is built with the region's bundle, then published
        progress=gcp_images.waiting_reason(region.name),
        sealed_join_token=runtime_of(session).sealer.seal(token.encode()),
    )
    session.add(rec)
    lifecycle.apply(
        session,
        rec,
        VmStatus.PENDING,
        kind=VM_KIND,
        name=rec.instance_name,
        table=VM_TRANSITIONS,
        actor=actor,
        reason=None,
        column="status",
        resource_id=region.id,
    )
    wake_after_commit(session, Wake.GCP_REGIONS)
    out["region"], out["node"] = region, node
    out["vm"] = {"instance": rec.instance_name, "status": rec.status, "progress": rec.progress}
    return out


def enrollment_bundle(session: Session, region: Region, join_token: str) -> dict[str, Any]:
    """The storage node's bundle (docs/enrollment-bundle.md): built by the one bundle function, with
    the URL that VMs in Google Cloud can reach and the CA they pin (docs/control-plane.md, "TLS")."""
    runtime = runtime_of(session)
    return join_tokens.bundle(
        session,
        region,
        join_token,
        control_plane_url=runtime.node_url(),
        ca_certificate=tls.node_trust(runtime.settings),
    )


def storage_status(session: Session, ref: str) -> dict[str, Any]:
    """Region, its storage node and the VM's progress: what `GET /v1/gcp/regions/REGION` shows."""
    region = region_service.get(session, ref, KIND)
    rec = session.get(GcpStorageNode, region.id)
    node = session.get(Node, rec.node_id) if rec else None
    vm_out = None
    if rec is not None:
        # keyword form: the keys "running" and "error" are fields here, not states (the states test)
        vm_out = dict(
            instance=rec.instance_name,
            zone=rec.zone,
            status=rec.status,
            running=rec.running,
            progress=rec.progress,
            error=rec.error,
        )
    return {"region": region, "node": node, "vm": vm_out}
