"""/v1/gcp: what only the Google Cloud provider offers — enable with a key (dry run, permission check),
a region's quota, region create with capacity check and storage node, and the storage VM's progress.
Removal uses the generic DELETE /v1/providers/gcp and /v1/regions/{ref}: they hand over to the gcp
reconcilers, which delete what rigbase made and then mark the resource removed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Operator, TrustRoot
from provisioner.api.errors import documented
from provisioner.api.schemas import NodeOut, ProviderOut, RegionOut
from provisioner.services.cloud import gcp as service
from provisioner.services.cloud import gcp_burst

# the fleet's own Google Cloud project: what it spends is every account's, so a root admin decides
router = APIRouter(prefix="/v1/gcp", tags=["gcp"], dependencies=[TrustRoot])


class GcpEnableIn(BaseModel):
    credentials: str = Field(description="the service-account JSON key (sealed at rest, never returned)")
    prefix: str | None = None
    payment_mode: str | None = None
    dry_run: bool = False


class GcpNodeIn(BaseModel):
    name: str
    region: str
    gpu_type: str = Field(description="a GPU type of regions/gcp-gpus.yaml offered in the region, e.g. A100")
    gpu_count: int = Field(1, description="1, 2, 4 or 8")
    reservation: str | None = Field(None, description="a Compute reservation the VM consumes (committed)")
    dry_run: bool = False


class GcpRegionIn(BaseModel):
    name: str
    gcp_region: str | None = Field(None, description="GCP region (default: the name)")
    storage_class: str
    public_jobs: bool = True
    dry_run: bool = False


def _out(result: dict[str, Any]) -> dict[str, Any]:
    """Store rows → wire shapes (the key never appears: ProviderOut shows public_config only)."""
    shaped = dict(result)
    for key, shape in (("provider", ProviderOut), ("region", RegionOut), ("node", NodeOut)):
        if shaped.get(key) is not None:
            shaped[key] = shape.of(shaped[key]).model_dump(mode="json")
    return shaped


@router.post("/enable", status_code=201)
def enable(body: GcpEnableIn, session: Db, actor: Operator) -> dict[str, Any]:
    raw = {"credentials": body.credentials, "prefix": body.prefix, "payment_mode": body.payment_mode}
    result = service.enable(session, {k: v for k, v in raw.items() if v}, dry_run=body.dry_run, actor=actor)
    return _out(result)


@router.get("/provider", responses=documented(404))
def bootstrap_status(session: Db) -> dict[str, Any]:
    return _out(service.bootstrap_status(session))


@router.get("/quota/{gcp_region}")
def region_quota(gcp_region: str, session: Db) -> dict[str, Any]:
    return service.region_quota(session, gcp_region).to_json()


@router.post("/regions", status_code=201)
def create_region(body: GcpRegionIn, session: Db, actor: Operator) -> dict[str, Any]:
    result = service.create_region(
        session,
        body.name,
        gcp_region=body.gcp_region,
        storage_class=body.storage_class,
        public_jobs=body.public_jobs,
        dry_run=body.dry_run,
        actor=actor,
    )
    return _out(result)


@router.post("/nodes", status_code=201)
def add_compute_node(body: GcpNodeIn, session: Db, actor: Operator) -> dict[str, Any]:
    """A permanent compute node on a VM of a GCP region (on demand, or in a reservation): the node joins
    like a physical one once the gcp-burst reconciler has made its VM."""
    result = gcp_burst.add_compute_node(
        session,
        body.name,
        region=body.region,
        gpu_type=body.gpu_type,
        gpu_count=body.gpu_count,
        reservation=body.reservation,
        dry_run=body.dry_run,
        actor=actor,
    )
    return _out(result)


@router.get("/regions/{ref}")
def storage_status(ref: str, session: Db) -> dict[str, Any]:
    return _out(service.storage_status(session, ref))
