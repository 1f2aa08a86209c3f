"""`provision region quota REGION [--json] [--from-json FILE]`: the quota table of one region.

Reads the region with RegionsClient.get (one call returns every regional quota) or a saved Region
resource — the JSON of `gcloud compute regions describe REGION --format=json` — for offline use, then
applies capacity.py's rule to each GPU type the catalogue lists for that region."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.errors import InvalidInput, Unavailable
from provisioner.providers.gcp import catalogue
from provisioner.providers.gcp.capacity import GpuCapacity, Quota, region_capacity

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext


@dataclass(frozen=True)
class RegionQuota:
    region: str
    quotas: dict[str, Quota]
    gpus: list[GpuCapacity]  # on-demand VMs
    spot: list[GpuCapacity] = field(default_factory=list)  # Spot VMs (preemptible quotas where there are)

    @property
    def runnable(self) -> bool:
        """Some GPU type has room for a job, on demand or on Spot VMs (preemptible quota alone will do)."""
        return any(g.runnable_jobs > 0 for g in (*self.gpus, *self.spot))

    def why_not_runnable(self) -> str:
        """One sentence for `region create` when every GPU type has zero capacity."""
        parts = [f"{g.gpu}: {g.limited_by.value}" for g in self.gpus]
        return (
            f"GCP region {self.region} has no capacity for any GPU type ({'; '.join(parts)}): "
            "request a quota increase in the Google Cloud console (IAM & Admin > Quotas) and try again"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "gpus": [g.to_json() for g in self.gpus],
            "spot": [g.to_json() for g in self.spot],
        }


def quotas_from_region_json(doc: Mapping[str, Any]) -> dict[str, Quota]:
    """Quotas from a Region resource in its REST/gcloud JSON form (camelCase, numbers may be floats)."""
    out: dict[str, Quota] = {}
    for q in doc.get("quotas", []) or []:
        try:
            out[str(q["metric"])] = Quota(limit=float(q.get("limit", 0)), usage=float(q.get("usage", 0)))
        except (KeyError, TypeError, ValueError):
            raise InvalidInput(
                f"quota entry {q!r} has no metric/limit/usage: "
                "pass the output of `gcloud compute regions describe REGION --format=json`"
            ) from None
    return out


def quotas_from_region(region: Any) -> dict[str, Quota]:
    """Quotas from a compute_v1.Region message."""
    return {q.metric: Quota(limit=float(q.limit), usage=float(q.usage)) for q in region.quotas}


def evaluate(region: str, quotas: Mapping[str, Quota], cat: catalogue.Catalogue | None = None) -> RegionQuota:
    cat = cat or catalogue.load()
    gpus = cat.gpus_in(region)
    return RegionQuota(
        region=region,
        quotas=dict(quotas),
        gpus=region_capacity(gpus, quotas),
        spot=region_capacity(gpus, quotas, preemptible=True),
    )


def from_json_file(path: Path, region: str | None = None) -> RegionQuota:
    """Offline: a saved Region resource. The region name comes from the file unless given."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput(
            f"cannot read {path}: {exc}; "
            "save it with `gcloud compute regions describe REGION --format=json > FILE`"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput(
            f"{path} is not a Region resource: "
            "save it with `gcloud compute regions describe REGION --format=json`"
        )
    if region and doc.get("name") and doc["name"] != region:
        raise InvalidInput(
            f"{path} describes {doc['name']}, not {region}: save the right region or pass {doc['name']}"
        )
    name = region or doc.get("name")
    if not name:
        raise InvalidInput(f"{path} has no region 'name': pass the region on the command line")
    catalogue.load().region(name)  # refuse regions outside the catalogue
    return evaluate(name, quotas_from_region_json(doc))


def fetch(ctx: GcpContext, region: str, cat: catalogue.Catalogue | None = None) -> RegionQuota:
    """Online: one RegionsClient.get call. `cat`: the provider's catalogue (default: the shipped one)."""
    cat = cat or catalogue.load()
    cat.region(region)
    from google.api_core import exceptions as gexc

    try:
        r = ctx.regions.get(project=ctx.project, region=region)
    except gexc.Forbidden as exc:
        raise Unavailable(
            f"reading quotas of {region} was refused ({exc.message}): "
            "give the service account the Compute Admin role"
        ) from None
    except gexc.GoogleAPICallError as exc:
        raise Unavailable(
            f"reading quotas of {region} failed ({exc.message}): check the project and try again"
        ) from None
    return evaluate(region, quotas_from_region(r), cat)


def fetch_many(ctx: GcpContext, regions: Iterable[str]) -> list[RegionQuota]:
    """Several regions at once: the calls are independent and I/O bound, so threads make the total ≈ one
    call."""
    names = list(regions)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return list(pool.map(lambda r: fetch(ctx, r), names))
