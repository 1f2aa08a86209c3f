"""Software TPMs for the lab and the tests: a private TPM vendor CA, swtpm states manufactured with EK
certificates from it, and swtpm socket processes.

Everything lives under directories the caller gives (the lab uses $RIGBASE_HOME/lab): the packaged
/etc/swtpm_setup.conf and /etc/swtpm-localca.conf point at /var/lib/swtpm-localca, so we always hand
swtpm_setup and swtpm_localca our own config files, and TMPDIR for their scratch files.

A swtpm has no resource manager and only 3 transient object slots; give each simulated node (and each
test) its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa

from contracts.errors import Unavailable
from contracts.processes import terminate

_TOOLS = ("swtpm", "swtpm_setup", "swtpm_localca")
_START_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0
# What swtpm_localca writes into platform certificates (shown by `tpm2_nvread 0x1c08000`).
_PLATFORM_OPTIONS = "--platform-manufacturer rigbase\n--platform-version 2.1\n--platform-model rigbase-lab\n"


def _require_tools() -> None:
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        raise Unavailable(
            f"{', '.join(missing)} not found; install the swtpm and swtpm-tools packages "
            "(scripts/install-deps.sh)"
        )


def _run(cmd: list[str], *, tmp: Path, what: str) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        log = next((Path(a) for a in cmd if a.endswith(".log")), None)
        text = log.read_text() if log and log.exists() else (proc.stderr or proc.stdout)
        tail = text.strip().splitlines()[-2:]
        raise Unavailable(
            f"{what} failed ({' / '.join(tail) or f'exit {proc.returncode}'}); "
            "check the swtpm-tools installation"
        )


@dataclass(frozen=True)
class VendorCA:
    """A TPM vendor CA made by swtpm_localca: a root and an intermediate that signs EK certificates."""

    directory: Path

    @property
    def root_certificate(self) -> Path:
        return self.directory / "swtpm-localca-rootca-cert.pem"

    @property
    def intermediate_certificate(self) -> Path:
        return self.directory / "issuercert.pem"

    @property
    def config(self) -> Path:
        return self.directory / "swtpm-localca.conf"

    @property
    def options(self) -> Path:
        return self.directory / "swtpm-localca.options"

    def certificate_pems(self) -> list[bytes]:
        """Root then intermediate, PEM: what an operator adds with `provision tpm-ca add`."""
        return [self.root_certificate.read_bytes(), self.intermediate_certificate.read_bytes()]


def create_vendor_ca(directory: Path) -> VendorCA:
    """Create (or reuse) a private vendor CA under `directory`.

    swtpm_localca makes its root and signing key the first time it certifies a key, so we have it
    certify a throw-away RSA key once; the certificate it writes is discarded."""
    _require_tools()
    ca = VendorCA(directory.resolve())
    if ca.root_certificate.exists() and ca.intermediate_certificate.exists():
        return ca
    ca.directory.mkdir(parents=True, exist_ok=True)
    d = ca.directory
    ca.config.write_text(
        f"statedir = {d}\nsigningkey = {d}/signkey.pem\nissuercert = {d}/issuercert.pem\n"
        f"certserial = {d}/certserial\n"
    )
    ca.options.write_text(_PLATFORM_OPTIONS)
    modulus = rsa.generate_private_key(65537, 2048).public_key().public_numbers().n
    scratch = d / "bootstrap"
    scratch.mkdir(exist_ok=True)
    _run(
        [
            "swtpm_localca",
            "--type",
            "ek",
            "--ek",
            f"{modulus:x}",
            "--dir",
            str(scratch),
            "--vmid",
            "bootstrap",
            "--tpm2",
            "--tpm-spec-family",
            "2.0",
            "--tpm-spec-revision",
            "164",
            "--tpm-spec-level",
            "0",
            "--tpm-manufacturer",
            "id:00001014",
            "--tpm-model",
            "swtpm",
            "--tpm-version",
            "id:20191023",
            "--configfile",
            str(ca.config),
            "--optsfile",
            str(ca.options),
        ],
        tmp=d / "tmp",
        what="swtpm_localca (creating the vendor CA)",
    )
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(d / "tmp", ignore_errors=True)
    return ca


@dataclass(frozen=True)
class Swtpm:
    """One software TPM: its state, its EK certificates, its socket and its process."""

    directory: Path

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def socket(self) -> Path:
        return self.directory / "tpm.sock"

    @property
    def ctrl_socket(self) -> Path:
        return self.directory / "tpm.sock.ctrl"

    @property
    def pid_file(self) -> Path:
        return self.directory / "swtpm.pid"

    @property
    def ek_certificate(self) -> Path:
        """The RSA-2048 EK certificate (DER) swtpm_setup wrote beside the state (also in NV 0x01C00002)."""
        return self.directory / "ekcerts" / "ek-rsa2048.crt"

    @property
    def tcti(self) -> str:
        return f"swtpm:path={self.socket}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self) -> str:
        """Start the swtpm socket process (no-op if running); return its TCTI string."""
        if self.pid() is not None:
            return self.tcti
        if not (self.state_dir / "tpm2-00.permall").exists():
            raise Unavailable(f"{self.directory} holds no manufactured TPM state; provision it first")
        for stale in (self.socket, self.ctrl_socket, self.pid_file):
            stale.unlink(missing_ok=True)
        subprocess.run(
            [
                "swtpm",
                "socket",
                "--tpm2",
                "--tpmstate",
                f"dir={self.state_dir}",
                "--server",
                f"type=unixio,path={self.socket}",
                "--ctrl",
                f"type=unixio,path={self.ctrl_socket}",
                "--flags",
                "not-need-init,startup-clear",
                "--pid",
                f"file={self.pid_file}",
                "--log",
                f"file={self.directory / 'swtpm.log'},level=1",
                "--daemon",
            ],
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not (self.socket.exists() and self.pid() is not None):
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"swtpm did not come up within {_START_TIMEOUT_S:.0f} s; "
                    f"see {self.directory / 'swtpm.log'}"
                )
            time.sleep(0.005)
        return self.tcti

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 5 s); the TPM state stays on disk."""
        pid = self.pid()
        if pid is not None:
            terminate(
                lambda sig: os.kill(pid, sig), lambda: _alive(pid), grace_s=_STOP_TIMEOUT_S, poll_s=0.005
            )
        for leftover in (self.socket, self.ctrl_socket, self.pid_file):
            leftover.unlink(missing_ok=True)

    def remove(self) -> None:
        """Stop and delete everything under the directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def provision_swtpm(directory: Path, ca: VendorCA, *, overwrite: bool = False) -> Swtpm:
    """Manufacture a TPM state under `directory`: RSA-2048 EK at 0x81010001 with its certificate in NV
    0x01C00002 (and the ECC P-384 EK and platform certificate swtpm_setup adds), signed by `ca`; only
    the sha256 PCR bank active. Reuses an existing state unless `overwrite`."""
    _require_tools()
    tpm = Swtpm(directory.resolve())
    if (tpm.state_dir / "tpm2-00.permall").exists() and not overwrite:
        return tpm
    tpm.state_dir.mkdir(parents=True, exist_ok=True)
    tpm.ek_certificate.parent.mkdir(exist_ok=True)
    setup_conf = tpm.directory / "swtpm_setup.conf"
    setup_conf.write_text(
        "create_certs_tool = /usr/bin/swtpm_localca\n"
        f"create_certs_tool_config = {ca.config}\n"
        f"create_certs_tool_options = {ca.options}\n"
        "active_pcr_banks = sha256\n"
    )
    _run(
        [
            "swtpm_setup",
            "--tpm2",
            "--tpm-state",
            f"dir://{tpm.state_dir}",
            "--config",
            str(setup_conf),
            "--create-ek-cert",
            "--create-platform-cert",
            "--pcr-banks",
            "sha256",
            "--write-ek-cert-files",
            str(tpm.directory / "ekcerts"),
            "--overwrite",
            "--logfile",
            str(tpm.directory / "swtpm_setup.log"),
        ],
        tmp=tpm.directory / "tmp",
        what="swtpm_setup",
    )
    shutil.rmtree(tpm.directory / "tmp", ignore_errors=True)
    return tpm


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0; it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False
