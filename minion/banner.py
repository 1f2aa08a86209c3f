"""`minion banner`: what the boot console (tty1, ttyS0) shows after boot.

The operator reads the minion_id off this screen to add the node (docs/product-rules.md, "Physical
server provisioning"), so the banner must always render: a missing TPM, bundle or network becomes a line
that says so, never a traceback. It fits 80x25, uses ASCII only (the Linux console font and serial
terminals have no box-drawing guarantees) and marks failures with words, not colour.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from contracts import bundle as contract_bundle
from contracts.identity import is_minion_id
from contracts.regional import StorageMode
from minion import gce_metadata
from minion.hardware.commands import HostRoot, InventoryFile, PublicJobsFlag, StorageModeOption
from minion.settings import BUNDLE_ENV, TCTI_ENV, MinionSettings
from minion.tpm.commands import DeviceKeyFlag

if TYPE_CHECKING:
    from minion.hardware.model import Inventory
    from minion.hardware.requirements import RequirementReport

WIDTH, HEIGHT = 80, 25
PRODUCT = "rigbase minion"
DEFAULT_BUNDLE = Path("/boot/efi/rigbase/bundle.json")
TPM_PROBLEM = "TPM missing or unreadable: "
MAX_ADDRESS_LINES = 2
MAX_NEXT_STEP_LINES = 3
LABEL = 11  # width of the left-hand labels ("minion_id  ")


@dataclass(frozen=True)
class BannerEnrollment:
    """What the banner needs from the enrollment bundle (docs/enrollment-bundle.md)."""

    path: Path
    region: str | None = None
    provider: str | None = None
    storage_mode: StorageMode | None = None
    public_jobs: bool = False
    problem: str | None = None
    from_metadata: bool = False  # a GCE VM: the bundle comes from the metadata server, not the boot drive


def read_bundle(path: Path) -> BannerEnrollment:
    """The bundle's region, provider, storage mode and public jobs (the banner checks the rules of the
    region's kind). Read with the one bundle reader (contracts/bundle.py); a problem becomes one line."""
    if not path.exists():
        return BannerEnrollment(path, problem=f"no enrollment bundle at {path}")
    try:
        bundle = contract_bundle.read_bundle(path)
    except contract_bundle.BundleError as exc:
        return BannerEnrollment(path, problem=f"unreadable bundle {path} ({exc.reason})")
    return BannerEnrollment(
        path,
        region=bundle.region,
        provider=bundle.provider,
        storage_mode=bundle.storage_mode,
        public_jobs=bundle.public_jobs,
    )


def banner_enrollment(
    given: Path | None, state_dir: Path, product_name: Path = gce_metadata.DMI_PRODUCT_NAME
) -> BannerEnrollment:
    """The bundle the banner reads: the one given, else the boot drive's; on a Compute Engine VM, which
    has none there, the one `minion gce-bundle` copied from the metadata server, or word that it will."""
    if given is not None or DEFAULT_BUNDLE.exists() or not gce_metadata.on_gce(product_name):
        return read_bundle(given or DEFAULT_BUNDLE)
    copied = state_dir / gce_metadata.STATE_BUNDLE
    if copied.exists():
        return read_bundle(copied)
    return BannerEnrollment(copied, problem="not read yet from the GCE metadata server", from_metadata=True)


def read_minion_id(tcti: str | None) -> tuple[str | None, str | None]:
    """(minion_id, None) or (None, why not). `minion.tpm.identity.minion_id` is imported lazily and
    guarded: it needs tpm2-pytss and a TPM, and the banner must render on machines that have neither."""
    os.environ.setdefault("TSS2_LOG", "all+none")  # tpm2-tss logs would scribble over the console
    try:
        from minion.tpm.identity import minion_id
    except ImportError as exc:
        return None, f"the TPM identity reader is not installed ({exc})"
    try:
        value = minion_id(tcti)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, reason
    if not isinstance(value, str) or not is_minion_id(value):
        return None, f"the TPM identity reader returned {value!r}, not 32 hex digits"
    return value, None


def read_device_key_id(state_dir: Path) -> tuple[str | None, str | None]:
    """A device without a TPM: (the minion_id of its device key, None), the key created on first use; or
    (None, why not) when the key file cannot be used."""
    from minion.device_key import DeviceKey, DeviceKeyUnusable

    try:
        return DeviceKey.load_or_create(state_dir).minion_id, None
    except (DeviceKeyUnusable, OSError) as exc:
        return None, str(exc)


def _fit(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def _field(label: str, value: str) -> str:
    return _fit(f"{label:<{LABEL}}{value}")


def _addresses(addresses: list[tuple[str, str]]) -> list[str]:
    if not addresses:
        return [_field("addresses", "none (no interface has an IP address)")]
    items = [f"{name} {address}" for name, address in addresses]
    lines = textwrap.wrap(", ".join(items), WIDTH - LABEL) or [""]
    if len(lines) > MAX_ADDRESS_LINES:
        lines = lines[:MAX_ADDRESS_LINES]
        lines[-1] = lines[-1][: WIDTH - LABEL - 4] + " ..."
    return [_field("addresses" if i == 0 else "", line) for i, line in enumerate(lines)]


def _hardware(inv: Inventory) -> str:
    from minion.hardware.units import gib, storage

    models = sorted({g.model for g in inv.gpus})
    gpus = f"{len(inv.gpus)} x {'/'.join(models)}" if inv.gpus else "no GPUs"
    nvme = sum(d.size_bytes for d in inv.nvme_drives)
    tpm = f"TPM {inv.tpm.major_version or '?'}.x" if inv.tpm.present else "no TPM"
    return _field(
        "hardware",
        f"{gpus}, {gib(inv.memory_total_bytes)} RAM, {inv.cpu.physical_cores} "
        f"cores, {len(inv.nvme_drives)} NVMe {storage(nvme)}, {tpm}",
    )


def next_step(
    minion_id: str | None,
    enrollment: BannerEnrollment,
    report: RequirementReport,
    inventory: Inventory | None = None,
) -> str:
    """The one thing the operator should do now, first blocker first."""
    if minion_id is None:
        if inventory is not None and inventory.tpm.present and inventory.tpm.major_version == 2:
            return (
                "The TPM 2.0 is installed but did not answer; clear it in the firmware setup and "
                "reboot (the minion_id comes from the TPM)."
            )
        return (
            "Enable the TPM 2.0 (or firmware TPM) in the firmware setup, clear it, and reboot; "
            "the minion_id comes from the TPM."
        )
    if not report.ok:
        failing = ", ".join(r.rule for r in report.failed)
        return f"Fix the requirements marked FAIL ({failing}); `minion check` explains each. Then reboot."
    if enrollment.region is None and enrollment.from_metadata:
        return (
            "This VM reads its enrollment bundle from the GCE metadata server once its network is up, "
            "then joins by itself; if it does not, `journalctl -u rigbase-gce-bundle` says why."
        )
    if enrollment.region is None:
        return (
            "This boot drive has no valid enrollment bundle; ask the control plane operator for a "
            "boot drive made for your region."
        )
    return (
        f"Write down the minion_id and add a node with it to region '{enrollment.region}' on the "
        "control plane; this machine then joins by itself."
    )


def render(
    *,
    minion_id: str | None,
    tpm_problem: str | None,
    enrollment: BannerEnrollment,
    addresses: list[tuple[str, str]],
    report: RequirementReport,
    inventory: Inventory | None = None,
    version: str | None = None,
    join_status: dict[str, Any] | None = None,
) -> str:
    """The banner text: at most 25 lines of at most 80 ASCII characters. `join_status` is what
    `minion run` last saw (minion/join/state.py): joining, pending, refused (with the reason), …"""
    version = version or _version()
    title = f"{PRODUCT} {version}"
    host = inventory.hostname if inventory else ""
    lines = [_fit(f"{title}{host:>{WIDTH - len(title)}}" if host else title), "=" * WIDTH]
    if minion_id:
        lines.append(_field("minion_id", minion_id))
    else:
        # The reason says what to check (device, TCTI), so it may take a second line.
        why = textwrap.wrap(TPM_PROBLEM + (tpm_problem or "unknown reason"), WIDTH - LABEL)
        if len(why) > 2:
            why = [why[0], why[1][: WIDTH - LABEL - 4] + " ..."]
        lines.extend(_field("minion_id" if i == 0 else "", part) for i, part in enumerate(why))
    if enrollment.region is not None:
        lines.append(
            _field(
                "region",
                f"{enrollment.region} ({enrollment.provider or 'provider ?'}) from {enrollment.path}",
            )
        )
    else:
        lines.append(_field("region", f"unknown: {enrollment.problem}"))
    if join_status and join_status.get("state"):
        message = join_status.get("message")
        lines.append(
            _field("join", f"{join_status['state']}: {message}" if message else str(join_status["state"]))
        )
    lines.extend(_addresses(addresses))
    if inventory is not None:
        lines.append(_hardware(inventory))
    lines.append("-" * WIDTH)
    passed = len(report.rules) - len(report.failed)
    lines.append(_fit(f"requirements ({report.scope}): {passed} of {len(report.rules)} pass"))
    for r in report.rules:
        mark = "[ ok ]" if r.ok else "[FAIL]"
        shown = r.found if r.ok else f"{r.found}; need {r.required}"
        lines.append(_fit(f"{mark} {r.rule:<18} {shown}"))
    lines.append("-" * WIDTH)
    step = textwrap.wrap(next_step(minion_id, enrollment, report, inventory), WIDTH - LABEL)
    lines.extend(_field("next step" if i == 0 else "", s) for i, s in enumerate(step[:MAX_NEXT_STEP_LINES]))
    ascii_lines = [line.encode("ascii", "replace").decode() for line in lines[:HEIGHT]]
    return "\n".join(ascii_lines) + "\n"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rigbase")
    except PackageNotFoundError:
        return "(version unknown)"


def banner_command(
    ctx: typer.Context,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            dir_okay=False,
            envvar=BUNDLE_ENV,
            show_default=str(DEFAULT_BUNDLE),
            help="The region enrollment bundle (docs/enrollment-bundle.md).",
        ),
    ] = None,
    tcti: Annotated[
        str | None,
        typer.Option(
            "--tcti", envvar=TCTI_ENV, help="TPM to read the minion_id from (tpm2-tss TCTI string)."
        ),
    ] = None,
    storage_mode: StorageModeOption = None,
    public_jobs: PublicJobsFlag = False,
    inventory_file: InventoryFile = None,
    host_root: HostRoot = None,
    device_key: DeviceKeyFlag = False,
) -> None:
    """Print the console banner: minion_id, region, addresses, requirement verdicts, next step.
    The storage mode and public jobs default to the bundle's settings when it carries them."""
    from minion.hardware.addresses import local_addresses
    from minion.hardware.commands import load_or_collect
    from minion.hardware.requirements import check

    settings = MinionSettings.of(ctx)
    enrollment = banner_enrollment(bundle, settings.state_dir)
    inventory = load_or_collect(inventory_file, host_root, settings.gpu_catalogue)
    report = check(inventory, storage_mode or enrollment.storage_mode, public_jobs or enrollment.public_jobs)
    minion_id, problem = read_device_key_id(settings.state_dir) if device_key else read_minion_id(tcti)
    from minion.join.state import StateDir

    join_status = StateDir(settings.state_dir).status() if settings.state_dir.is_dir() else None
    print(
        render(
            minion_id=minion_id,
            tpm_problem=problem,
            enrollment=enrollment,
            addresses=local_addresses(host_root),
            report=report,
            inventory=inventory,
            join_status=join_status,
        ),
        end="",
    )


def register(app: typer.Typer) -> None:
    app.command("banner")(banner_command)
