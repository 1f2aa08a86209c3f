"""`provision region …`: create, list, show, remove."""

from __future__ import annotations

from typing import Annotated

import typer

from contracts.regional import StorageMode
from provisioner.cli import gcp, render
from provisioner.cli.common import Json, Yes, group, output_options, remove_one, show_one
from provisioner.cli.settings import connect

app = group("Regions: groups of nodes of one provider, named by a DNS label.")
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("provider", "PROVIDER"),
    ("storage_mode", "STORAGE"),
    ("public_jobs", "PUBLIC JOBS"),
    ("state", "STATE"),
    ("reason", "REASON"),
]
ProviderOpt = Annotated[
    str | None,
    typer.Option("--provider", "-p", help="Provider kind (when two providers share a region name)."),
]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="DNS label: lowercase letters, digits, hyphens; 1-63.")],
    provider: Annotated[str, typer.Option("--provider", "-p", help="Provider kind, e.g. physical.")],
    storage_mode: Annotated[
        StorageMode,
        typer.Option("--storage-mode", help="local: SATA drives in each node; central: one storage node."),
    ] = StorageMode.LOCAL,
    public_jobs: Annotated[
        bool, typer.Option("--public-jobs/--no-public-jobs", help="Sell spare capacity to public jobs.")
    ] = True,
    storage_class: Annotated[
        str | None,
        typer.Option("--storage-class", help="gcp: storage node size: small, medium, large, xlarge."),
    ] = None,
    gcp_region: Annotated[
        str | None, typer.Option("--gcp-region", help="gcp: the GCP region (default: NAME).")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="gcp: check quota and show what would be created; create nothing."),
    ] = False,
    json_out: Json = False,
) -> None:
    """Create a region; prints its id."""
    if provider == "gcp":
        return gcp.create_region(name, gcp_region, storage_class, public_jobs, dry_run, json_out)
    body = {
        "name": name,
        "provider": provider,
        "storage_mode": storage_mode.value,
        "public_jobs": public_jobs,
    }
    render.created(connect().post("/v1/regions", body), as_json=json_out)


@app.command("list")
@output_options
def list_(provider: ProviderOpt = None, json_out: Json = False) -> None:
    """List regions."""
    rows = render.by_region_then_name(connect().get("/v1/regions", provider=provider)["items"])
    render.table(
        rows,
        COLUMNS,
        as_json=json_out,
        empty="no region yet: `provision region create NAME --provider physical`",
    )


@app.command("show")
@output_options
def show(name: str, provider: ProviderOpt = None, json_out: Json = False) -> None:
    """Show one region (by name or id)."""
    show_one(f"/v1/regions/{name}", as_json=json_out, provider=provider)


@app.command("remove")
def remove(
    name: str,
    provider: ProviderOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also remove the region's nodes, reservations and datastores.")
    ] = False,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Remove a region (refused while it has nodes, reservations or datastores, unless --force)."""
    everything = " with all its nodes, reservations and datastores" if force else ""
    # refused before it asks: the server answers the removal without making it
    connect().delete(f"/v1/regions/{name}", force=force, provider=provider, dry_run=True)
    remove_one(
        f"remove region '{name}'{everything}?",
        f"/v1/regions/{name}",
        yes=yes,
        as_json=json_out,
        force=force,
        provider=provider,
    )


app.command("quota")(gcp.quota)  # `provision region quota`: one GCP region's quotas (gcp.py)
