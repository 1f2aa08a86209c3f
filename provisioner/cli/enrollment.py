"""Enrollment commands: `provision region join-token|bundle|update`, `provision node pending|retry`
and the `provision tpm-ca` group. The region and node commands attach to those groups' Typer apps
(importing this module is the one line in main.py); `tpm_ca` is its own group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from contracts.bundle import EnrollmentBundle, refuse_loopback, write_bundle
from contracts.errors import RigbaseError
from provisioner.cli import nodes, regions, render
from provisioner.cli.common import (
    EXIT_USAGE,
    Json,
    RegionOpt,
    Yes,
    confirm,
    fail,
    group,
    output_options,
    read_input,
)
from provisioner.cli.settings import connect
from provisioner.domain.pages import REFUSALS_PAGE

TOKEN_COLUMNS: render.Columns = [
    ("id", "ID"),
    ("region", "REGION"),
    ("state", "STATE"),  # issued, expired or revoked
    ("created_at", "AGE", render.ago("created_at")),
    ("expires_at", "EXPIRES", render.until("expires_at")),
]
TOKEN_WIDE: render.Columns = [("expires_at", "EXPIRES AT"), ("revoked_at", "REVOKED AT")]
CA_COLUMNS = [("id", "ID"), ("subject", "SUBJECT"), ("sha256", "SHA256"), ("not_after", "NOT AFTER")]
PENDING_COLUMNS: render.Columns = [
    ("minion_id", "MINION ID"),
    ("region", "REGION"),
    ("attested", "ATTESTED"),
    ("requirements", "REQUIREMENTS"),
    ("last_seen", "LAST SEEN", render.ago("last_seen")),
    ("first_seen", "AGE", render.ago("first_seen")),
    ("inventory", "INVENTORY"),
]
PENDING_WIDE: render.Columns = [("identity", "IDENTITY"), ("refusal", "LAST REFUSAL")]
Ttl = Annotated[str, typer.Option("--ttl", help="Token lifetime: 30m, 24h, 7d, 2w or 'never'.")]


# ---------------------------------------------------------------- provision region …


@regions.app.command("join-token")
def join_token(
    region: str,
    ttl: Ttl = "7d",
    revoke: Annotated[
        str | None,
        typer.Option("--revoke", metavar="ID", help="Revoke this one join token (ids: --list)."),
    ] = None,
    revoke_all: Annotated[
        bool, typer.Option("--revoke-all", help="Revoke every live join token of the region.")
    ] = False,
    list_: Annotated[
        bool,
        typer.Option("--list", help="List the region's join tokens: issued, expired, revoked (no secrets)."),
    ] = False,
    output: Annotated[
        render.Output, typer.Option("--output", "-o", help="With --list: table, wide, json or yaml.")
    ] = render.Output.TABLE,
    json_out: Json = False,
) -> None:
    """Issue a region join token (printed once; only its hash is stored), or --list / --revoke them.

    Example: provision region join-token lab-1 --revoke jt_0123456789abcdef
    """
    client = connect()
    render.use(render.Output.JSON if json_out else output)
    if revoke is not None:
        out = client.delete(f"/v1/regions/{region}/join-tokens/{revoke}")
        if not render.machine(out, render.chosen()):
            print(f"join token {out['id']} of region '{out['region']}' is {out['state']}")
    elif revoke_all:
        out = client.delete(f"/v1/regions/{region}/join-tokens")
        if not render.machine(out, render.chosen()):
            print(f"revoked {out['revoked']} join token(s) of region '{region}'")
    elif list_:
        render.table(
            client.get(f"/v1/regions/{region}/join-tokens")["items"],
            TOKEN_COLUMNS,
            wide=TOKEN_WIDE,
            empty=f"no join token yet: `provision region join-token {region}`",
        )
    else:
        out = client.post(f"/v1/regions/{region}/join-tokens", {"ttl": ttl})
        render.print_json(out) if json_out else print(out["token"])


@regions.app.command("bundle")
def bundle(
    region: str,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="File to write (mode 0600: it holds a join token); - for stdout."
        ),
    ],
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl",
            help="A new token of this lifetime (30m, 24h, 7d, 2w or 'never'); "
            "default: the region's live bundle token again, or a new one of 7d.",
        ),
    ] = None,
    new_token: Annotated[
        bool, typer.Option("--new-token", help="A new token (of --ttl, default 7d), never the live one.")
    ] = False,
    control_plane_url: Annotated[
        str | None,
        typer.Option(
            "--control-plane-url", help="URL the nodes reach the API at (default: the URL this CLI uses)."
        ),
    ] = None,
    ca_certificate: Annotated[
        Path | None,
        typer.Option("--ca-certificate", dir_okay=False, help="PEM of the CA of the API's TLS certificate."),
    ] = None,
    allow_loopback: Annotated[
        bool,
        typer.Option(
            "--allow-loopback", help="Accept a loopback URL (a single-host test: nodes on this machine only)."
        ),
    ] = False,
) -> None:
    """Write the region's enrollment bundle (docs/enrollment-bundle.md): with the join token its last
    bundle carried while that one enrols for a day more, else (or with --ttl / --new-token) a new one."""
    client = connect()
    url = control_plane_url or client.url
    if not allow_loopback:
        try:
            refuse_loopback(url)
        except RigbaseError as exc:
            fail(exc.message, exit_code=EXIT_USAGE)
    ca = None if ca_certificate is None else read_input(ca_certificate, "the CA certificate in PEM")
    ttl = ttl or ("7d" if new_token else None)
    body = {"control_plane_url": url, "ca_certificate": ca, "ttl": ttl}
    out = client.post(f"/v1/regions/{region}/bundle", body)
    made = EnrollmentBundle.model_validate(out)
    if str(output) == "-":
        print(made.to_json())
    else:
        write_bundle(output, made)
        print(output)
    # on stderr, so `-o -` stays the bundle alone: what an operator must know before flashing media
    which = "the region's live join token" if out.get("token_reused") else "a new join token"
    print(f"{which} ({out.get('token_id')}); {_enrols_until(region, out.get('expires_at'))}", file=sys.stderr)


def _enrols_until(region: str, expires_at: str | None) -> str:
    if expires_at is None:
        return f"media with this bundle enrol nodes into '{region}' until its token is revoked (ttl never)"
    left = render.until("expires_at")({"expires_at": expires_at})
    return (
        f"media with this bundle enrol nodes into '{region}' until {expires_at} ({left}); after that a node "
        f"booted from it is refused: write a fresh one with `provision region bundle {region} -o FILE`"
    )


@regions.app.command("update")
def update(
    region: str,
    allow_ek_without_cert: Annotated[
        bool | None,
        typer.Option(
            "--allow-ek-without-cert/--require-ek-cert",
            help="Accept TPMs whose EK has no vendor certificate "
            "(opt-in; trust the hardware's origin first).",
        ),
    ] = None,
    allow_devices_without_tpm: Annotated[
        bool | None,
        typer.Option(
            "--allow-devices-without-tpm/--refuse-devices-without-tpm",
            help="Let devices without a TPM (Jetson Xavier) join with a device key: weaker than a TPM, "
            "no boot measurements (docs/devices.md).",
        ),
    ] = None,
    public_jobs: Annotated[
        bool | None,
        typer.Option(
            "--public-jobs/--no-public-jobs",
            help="Sell the region's spare capacity to other accounts' jobs for credits (docs/billing.md).",
        ),
    ] = None,
    jobs_lan: Annotated[
        bool | None,
        typer.Option(
            "--jobs-lan/--no-jobs-lan",
            help="Let the region's jobs reach the LAN (its datastores and peers); never the node itself "
            "or a cloud's metadata server (docs/minion-jobs.md).",
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """Change a region's settings: attestation opt-ins, public jobs, the jobs' LAN. Settings not named stay
    as they are."""
    attestation = {
        "allow_ek_without_cert": allow_ek_without_cert,
        "allow_devices_without_tpm": allow_devices_without_tpm,
    }
    attestation = {k: v for k, v in attestation.items() if v is not None}
    if not attestation and public_jobs is None and jobs_lan is None:
        raise typer.BadParameter(
            "name a setting to change: --allow-ek-without-cert/--require-ek-cert, "
            "--allow-devices-without-tpm/--refuse-devices-without-tpm, --public-jobs/--no-public-jobs "
            "or --jobs-lan/--no-jobs-lan"
        )
    client = connect()
    out: dict[str, Any] = {}
    if attestation:
        out = client.post(f"/v1/regions/{region}/attestation", attestation)
    patch = {k: v for k, v in {"public_jobs": public_jobs, "jobs_lan": jobs_lan}.items() if v is not None}
    if patch:
        out = client.patch(f"/v1/regions/{region}", patch)
    render.detail(out, as_json=json_out)


# ---------------------------------------------------------------- provision node …


@nodes.app.command("pending")
@output_options
def pending(
    region: Annotated[str | None, typer.Option("--region", "-r", help="Only this region's minions.")] = None,
    json_out: Json = False,
) -> None:
    """Minions that reached the control plane and wait for `provision node accept MINION_ID --name NAME`."""
    rows = connect().get("/v1/pending-minions", region=region)["items"]
    rows = sorted(rows, key=lambda r: (r["region"], r["minion_id"]))
    render.table(
        rows,
        PENDING_COLUMNS,
        wide=PENDING_WIDE,
        as_json=json_out,
        empty="no pending minion: boot a node from the region's media (`provision region bundle`)",
    )


@nodes.app.command("refusals")
@output_options
def refusals(
    minion_id: Annotated[str | None, typer.Option("--minion-id", help="Only this minion's refusals.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=REFUSALS_PAGE)] = 50,
    json_out: Json = False,
) -> None:
    """Refused joins and failed continuous attestations (the audit trail), newest first."""
    rows = connect().get("/v1/join-refusals", minion_id=minion_id, limit=limit)["items"]
    render.table(
        rows,
        [("at", "AGE", render.ago("at")), ("minion_id", "MINION ID"), ("name", "NODE"), ("reason", "WHY")],
        wide=[("at", "WHEN")],
        as_json=json_out,
        empty="no refused join",
    )


@nodes.app.command("retry")
def retry(
    name: str,
    region: RegionOpt = None,
    accept_pcrs: Annotated[
        bool,
        typer.Option(
            "--accept-pcrs",
            help="Forget the recorded PCR baseline: the next join records the current values.",
        ),
    ] = False,
    json_out: Json = False,
) -> None:
    """Retry an errored node: it goes back to new and joins again at the minion's next attempt."""
    out = connect().post(f"/v1/nodes/{name}/retry", {"accept_pcrs": accept_pcrs}, region=region)
    fields = None if json_out else ["id", "name", "region", "state", "minion_id"]
    render.detail(out, as_json=json_out, fields=fields)


# ---------------------------------------------------------------- provision tpm-ca …

tpm_ca = group("Trusted TPM vendor CAs: EK certificates must chain to one of these.")


@tpm_ca.command("add")
def ca_add(
    file: Annotated[
        Path, typer.Argument(dir_okay=False, help="PEM file: the vendor's root and/or intermediate CA.")
    ],
    json_out: Json = False,
) -> None:
    """Trust the CA certificate(s) in FILE; prints their ids."""
    pem = read_input(file, "a PEM certificate file")
    rows = connect().post("/v1/tpm-cas", {"pem": pem})["items"]
    if json_out:
        render.print_json(rows)
    else:
        for row in rows:
            print(row["id"])


@tpm_ca.command("list")
@output_options
def ca_list(json_out: Json = False) -> None:
    """List trusted TPM vendor CAs."""
    render.table(
        connect().get("/v1/tpm-cas")["items"],
        CA_COLUMNS,
        as_json=json_out,
        empty="no TPM vendor CA trusted yet: `provision tpm-ca add VENDOR-CA.pem`",
    )


@tpm_ca.command("remove")
def ca_remove(
    ref: Annotated[str, typer.Argument(help="Id or SHA-256 prefix (8+ characters).")],
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Stop trusting a TPM vendor CA (joined nodes keep their credentials)."""
    confirm(f"stop trusting TPM CA '{ref}'?", yes)
    render.detail(connect().delete(f"/v1/tpm-cas/{ref}"), as_json=json_out)
