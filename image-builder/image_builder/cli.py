"""`image-builder`: build, keygen, verify, resolve-nvidia (docs/image-builder.md).

Typer + Rich with the conventions of the control plane's `provision`: `--json` on every command puts
machine output on stdout, exit codes 0 ok / 1 refused or failed / 2 usage, and every error is one line
on stderr saying what to do next (cli_render.py). Heavy imports stay inside the commands, so `--help`
is instant. The environment is read once per command, by the callback (BuilderSettings, settings.py),
and what it decides is passed down."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from image_builder.cli_render import UsageErrorsOnOneLine, detail, fail, print_json, progress
from image_builder.settings import BuilderSettings

app = typer.Typer(
    cls=UsageErrorsOnOneLine,
    help="Build rigbase's TPM-measured USB boot media.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as in `provision` and `minion`
)

Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
Cache = Annotated[
    Path | None, typer.Option("--cache", help="Cache directory (default $RIGBASE_HOME/cache/image-builder).")
]
Key = Annotated[
    Path | None, typer.Option("--key", help="Ed25519 signing key (default from `image-builder keygen`).")
]


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        try:
            print(f"image-builder: {metadata.version('rigbase')}")
        except metadata.PackageNotFoundError:
            print("image-builder: unknown (not installed)")
        raise typer.Exit()


@app.callback()
def _load_settings(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version, help="Print image-builder's version."),
    ] = False,
) -> None:
    """Build rigbase's TPM-measured USB boot media."""
    ctx.obj = BuilderSettings.from_env()


def _settings(ctx: typer.Context) -> BuilderSettings:
    """What the callback loaded. A command invoked without it (another Typer app registering these
    functions) reads the environment here, once."""
    settings = ctx.find_object(BuilderSettings)
    return settings if settings is not None else BuilderSettings.from_env()


def _repo() -> Path:
    """The rigbase checkout whose wheel goes on the image (this package lives in REPO/image-builder/)."""
    return Path(__file__).resolve().parents[2]


@contextmanager
def _refusals() -> Iterator[None]:
    """The builder's own errors already say what to do; a file that cannot be read names its path."""
    from image_builder.errors import BuildError
    from image_builder.manifest import ManifestError

    try:
        yield
    except (BuildError, ManifestError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or 'a file'}: {exc.strerror or exc}; check the path and try again")


def _refuse_loopback(bundle: Path) -> None:
    """One line and exit 1 when the bundle's control plane is on loopback (what it builds could never reach
    it); a bundle that cannot be read is left to the build, which names its path."""
    from contracts.bundle import BundleError, read_bundle, refuse_loopback
    from contracts.errors import InvalidInput

    try:
        refuse_loopback(read_bundle(bundle).control_plane_url)
    except BundleError:
        pass
    except InvalidInput as exc:
        fail(exc.message)


@app.command("build")
def build(
    ctx: typer.Context,
    bundle: Annotated[
        Path, typer.Option("--bundle", help="Region enrollment bundle (`provision region bundle`).")
    ],
    output: Annotated[Path, typer.Option("--output", help="Directory for the image, UKI and manifest.")],
    cache: Cache = None,
    key: Key = None,
    with_nvidia: Annotated[
        bool, typer.Option("--with-nvidia", help="Add Debian's non-free NVIDIA driver stack.")
    ] = False,
    mirror: Annotated[
        str | None, typer.Option("--mirror", help="Debian mirror (default: the one apt uses here).")
    ] = None,
    target: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            help="What to build from the same UKI and root, repeatable: usb (always) and gce (a Compute "
            "Engine boot disk, rigbase-gce.tar.gz, for `provision image publish --provider gcp`).",
        ),
    ] = None,
    plan: Annotated[bool, typer.Option("--plan", help="Print the build plan as JSON and stop.")] = False,
    allow_loopback: Annotated[
        bool,
        typer.Option(
            "--allow-loopback",
            help="Accept a bundle whose control-plane URL is loopback (media for a VM on this host only).",
        ),
    ] = False,
    json_out: Json = False,
) -> None:
    """Build the USB image (and with --target gce the GCE boot disk), its UKI and the signed manifest."""
    from image_builder import build as builder
    from image_builder.plan import TARGETS, BuildConfig

    unknown = sorted(set(target or ()) - set(TARGETS))
    if unknown:
        fail(f"unknown --target {', '.join(unknown)}: choose from {', '.join(TARGETS)}", exit_code=2)

    settings = _settings(ctx)
    repo = _repo()
    if not allow_loopback:  # media that can never reach its control plane, caught before minutes of build
        _refuse_loopback(bundle)
    with _refusals():
        cfg = BuildConfig(
            bundle=bundle,
            output=output,
            cache=cache or settings.cache_dir(),
            key=key or settings.signing_key(),
            with_nvidia=with_nvidia,
            source_date_epoch=builder.default_epoch(repo, settings.source_date_epoch),
            repo=repo,
            mirror=mirror,
            targets=tuple(t for t in TARGETS if t == "usb" or t in (target or ())),
        )
        if plan:
            print_json(cfg.as_plan())
            return
        with progress("building") as log:
            doc = builder.build(cfg, log=log)
    summary = {
        "output": str(output),
        "image": str(output / doc["image"]["file"]),
        "image_sha256": doc["image"]["sha256"],
        "uki_sha256": doc["uki"]["sha256"],
        "root_hash": doc["verity"]["root_hash"],
        "pcr11": doc["pcr11"][-1]["sha256"],
        "manifest": str(output / "manifest.json"),
        "timings_s": doc["_timings"],
    }
    if "gce" in doc["targets"]:
        summary["gce_image"] = str(output / doc["targets"]["gce"]["file"])
        summary["gce_image_sha256"] = doc["targets"]["gce"]["sha256"]
    if json_out:
        print_json(summary)
    else:
        detail(
            summary,
            fields=["image", "image_sha256", *(["gce_image"] if "gce_image" in summary else []), "manifest"]
            + ["root_hash", "pcr11"],
        )


@app.command("device-bundle")
def device_bundle(
    ctx: typer.Context,
    region_bundle: Annotated[
        Path, typer.Option("--region-bundle", help="Region enrollment bundle (`provision region bundle`).")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The archive to write, e.g. rigbase-device.tar.gz.")
    ],
    cache: Cache = None,
    allow_loopback: Annotated[
        bool,
        typer.Option(
            "--allow-loopback",
            help="Accept a bundle whose control-plane URL is loopback (tests on this host).",
        ),
    ] = False,
    json_out: Json = False,
) -> None:
    """Build the minion for a Jetson on JetPack (aarch64): one tar.gz with install.sh (docs/devices.md)."""
    from image_builder import build as builder
    from image_builder import device_bundle as devices

    settings = _settings(ctx)
    repo = _repo()
    if not allow_loopback:  # a device could never reach its control plane
        _refuse_loopback(region_bundle)
    with _refusals(), progress("building the device bundle") as log:
        doc = devices.build(
            repo=repo,
            region_bundle=region_bundle,
            output=output,
            cache=cache or settings.cache_dir(),
            epoch=builder.default_epoch(repo, settings.source_date_epoch),
            log=log,
        )
    if json_out:
        print_json(doc)
    else:
        detail(doc, fields=["output", "sha256", "bytes", "region"])


@app.command("keygen")
def keygen(
    ctx: typer.Context,
    key: Annotated[
        Path | None, typer.Option("--key", help="Where to write the private key (.pub beside it).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key.")] = False,
    json_out: Json = False,
) -> None:
    """Make the builder's Ed25519 signing key."""
    from image_builder import manifest

    with _refusals():
        private, public = manifest.keygen(key or _settings(ctx).signing_key(), force=force)
    out = {"private_key": str(private), "public_key": str(public)}
    if json_out:
        print_json(out)
        return
    detail(out)
    print("next: give the public key to `provision image trust-key`", file=sys.stderr)


@app.command("verify")
def verify(
    manifest_file: Annotated[
        Path, typer.Argument(metavar="MANIFEST", help="manifest.json (its .sig beside it).")
    ],
    public_key: Annotated[Path, typer.Option("--public-key", help="The builder's public key (builder.pub).")],
    json_out: Json = False,
) -> None:
    """Check a manifest's signature with a builder public key."""
    from image_builder import manifest

    with _refusals():
        signature = manifest_file.with_name(manifest_file.name + manifest.SIGNATURE_SUFFIX)
        doc = manifest.verify(manifest_file.read_bytes(), signature.read_bytes(), public_key.read_bytes())
    out = {
        "manifest": str(manifest_file),
        "verified": True,
        "schema": doc.get("schema"),
        "builder_key_sha256": doc.get("builder", {}).get("key_sha256"),
        "image_sha256": doc.get("image", {}).get("sha256"),
        "root_hash": doc.get("verity", {}).get("root_hash"),
    }
    if json_out:
        print_json(out)
    else:
        detail(out)


@app.command("resolve-nvidia")
def resolve_nvidia(ctx: typer.Context, cache: Cache = None, json_out: Json = False) -> None:
    """Check that the NVIDIA package set resolves (apt --simulate against the cached tree)."""
    from image_builder import rootfs

    with _refusals(), progress("resolving the NVIDIA package set") as log:
        base = rootfs.base_tree(cache or _settings(ctx).cache_dir(), rootfs.inputs_for(False), log)
        simulated = rootfs.simulate_install(base, rootfs.NVIDIA_PACKAGES, rootfs.apt_mirror())
    installs = [line.removeprefix("Inst ") for line in simulated.splitlines() if line.startswith("Inst ")]
    if json_out:
        print_json({"packages": list(rootfs.NVIDIA_PACKAGES), "installs": installs})
    else:
        print("\n".join(f"Inst {line}" for line in installs))


def main(argv: list[str] | None = None) -> None:
    """`python -c 'from image_builder.cli import main; main()'` and older callers: the same app."""
    app(args=argv, prog_name="image-builder")
