"""A QEMU (TCG) machine for booting the image: OVMF, a swtpm, the USB image on xHCI and blank NVMe drives,
and a serial-console driver. Used by the boot tests and the benchmark; KVM hangs on these hosts, so TCG.

One QEMU at a time on a shared 2-core host: the caller owns the instance and must close() it."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.bundle import CONTROL_PLANE_PORT

log = logging.getLogger(__name__)

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")

#: With `control_plane_port`, the guest reaches the host's control plane at this address and port (a QEMU
#: user-network guestfwd; nothing else leaves the guest: restrict=on).
GUEST_CONTROL_PLANE = "10.0.2.100"
GUEST_CONTROL_PLANE_PORT = CONTROL_PLANE_PORT

#: As a GCE VM (`gce_disk`): the user network is GCE's link-local one, so the metadata server is where the
#: image's /etc/hosts says (169.254.169.254:80, as on Compute Engine) and the control plane is beside it.
GCE_NET = "169.254.169.0/24"
GCE_METADATA = "169.254.169.254"
GCE_CONTROL_PLANE = "169.254.169.100"
GCE_PRODUCT = "Google Compute Engine"  # the DMI product name the image's GCE units look for

#: Ports of one AHCI controller (QEMU's `ahci` device has six).
AHCI_PORTS = 6


class ConsoleTimeout(AssertionError):
    """The console did not show what we waited for; the message carries the console's tail."""


@dataclass
class TpmProcess:
    """A swtpm serving QEMU's tpm-emulator backend on a control socket (QEMU sends INIT/startup itself,
    so no not-need-init/startup-clear flags here, unlike a swtpm used directly by a TSS)."""

    state_dir: Path
    directory: Path
    proc: subprocess.Popen | None = None

    @property
    def ctrl(self) -> Path:
        return self.directory / "qemu-tpm.ctrl"

    def start(self) -> None:
        self.ctrl.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                "swtpm",
                "socket",
                "--tpm2",
                "--tpmstate",
                f"dir={self.state_dir}",
                "--ctrl",
                f"type=unixio,path={self.ctrl}",
                "--log",
                f"file={self.directory / 'qemu-swtpm.log'},level=1",
                "--terminate",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while not self.ctrl.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"swtpm did not start; see {self.directory / 'qemu-swtpm.log'}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.ctrl.unlink(missing_ok=True)


class MonitorError(RuntimeError):
    """QEMU's QMP monitor refused a command or did not answer."""


@dataclass
class Machine:
    """One QEMU guest. The disks are files the caller owns: NVMe drives and SATA drives are written in
    place (they survive `system_reset()`, `power_cycle()` and a new Machine on the same files), the USB
    image is opened with snapshot=on (the flashed image never changes; the guest's writes last until QEMU
    exits)."""

    workdir: Path
    usb_image: Path | None
    nvme_images: list[Path]
    tpm_state: Path
    memory_mb: int = 1536
    # SATA drives, each an ide-hd on one port of an AHCI controller (at most AHCI_PORTS)
    sata_images: list[Path] = field(default_factory=list)
    # None: no network at all (-nic none). A port: user networking (DHCP from QEMU, restrict=on) on a
    # virtio NIC reporting 10 GbE, whose only way out is GUEST_CONTROL_PLANE:GUEST_CONTROL_PLANE_PORT,
    # forwarded by socat to 127.0.0.1:control_plane_port on the host
    control_plane_port: int | None = None
    # A GCE VM instead: this disk (disk.raw of the GCE target) is the boot drive, on virtio-scsi as Compute
    # attaches one (NVMe drives beside it are its local SSDs); the DMI product name is GCE's; with
    # `metadata_port` the guest's GCE_METADATA:80 is forwarded to that host port (a metadata server) and
    # GCE_CONTROL_PLANE:8470 to `control_plane_port`
    gce_disk: Path | None = None
    metadata_port: int | None = None
    proc: subprocess.Popen | None = None
    tpm: TpmProcess | None = None
    output: bytearray = field(default_factory=bytearray)
    _reader: threading.Thread | None = None

    @property
    def monitor_path(self) -> Path:
        """The QMP monitor's unix socket (beside swtpm's control socket, which is longer)."""
        return self.workdir / "qmp.sock"

    def network_args(self) -> list[str]:
        if self.control_plane_port is None:
            return ["-nic", "none"]
        forward = (
            f"guestfwd=tcp:{GUEST_CONTROL_PLANE}:{GUEST_CONTROL_PLANE_PORT}"
            f"-cmd:socat - TCP:127.0.0.1:{self.control_plane_port}"
        )
        if self.gce_disk is not None:
            forward = (
                f"net={GCE_NET},guestfwd=tcp:{GCE_CONTROL_PLANE}:{GUEST_CONTROL_PLANE_PORT}"
                f"-cmd:socat - TCP:127.0.0.1:{self.control_plane_port}"
            )
            if self.metadata_port is not None:
                forward += f",guestfwd=tcp:{GCE_METADATA}:80-cmd:socat - TCP:127.0.0.1:{self.metadata_port}"
        return [
            "-netdev",
            f"user,id=n0,restrict=on,{forward}",
            "-device",
            "virtio-net-pci,netdev=n0,speed=10000,duplex=full",
        ]

    def sata_args(self) -> list[str]:
        if not self.sata_images:
            return []
        if len(self.sata_images) > AHCI_PORTS:
            raise ValueError(
                f"at most {AHCI_PORTS} SATA drives (one AHCI controller), got {len(self.sata_images)}"
            )
        argv = ["-device", "ahci,id=ahci"]
        for i, img in enumerate(self.sata_images):
            argv += [
                "-drive",
                f"if=none,id=sata{i},format=raw,file={img}",
                "-device",
                f"ide-hd,drive=sata{i},bus=ahci.{i},serial=rigbase-sata{i}",
            ]
        return argv

    def argv(self) -> list[str]:
        vars_fd = self.workdir / "OVMF_VARS.fd"
        if not vars_fd.exists():
            shutil.copyfile(OVMF_VARS, vars_fd)
        argv = [
            "qemu-system-x86_64",
            "-machine",
            "q35,accel=tcg",
            "-cpu",
            "max",
            "-smp",
            "1",
            "-m",
            str(self.memory_mb),
            *self.network_args(),
            "-display",
            "none",
            "-monitor",
            "none",
            "-qmp",
            f"unix:{self.monitor_path},server=on,wait=off",
            "-serial",
            "stdio",
            "-no-user-config",
            "-drive",
            f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
            "-drive",
            f"if=pflash,format=raw,unit=1,file={vars_fd}",
            "-chardev",
            f"socket,id=chrtpm,path={self.tpm.ctrl if self.tpm else ''}",
            "-tpmdev",
            "emulator,id=tpm0,chardev=chrtpm",
            "-device",
            "tpm-crb,tpmdev=tpm0",
            "-device",
            "qemu-xhci,id=xhci",
        ]
        if self.gce_disk is not None:
            argv += [
                "-smbios",
                f"type=1,manufacturer=Google,product={GCE_PRODUCT}",
                "-device",
                "virtio-scsi-pci,id=scsi",
                "-drive",
                f"if=none,id=boot,format=raw,file={self.gce_disk}",
                "-device",
                "scsi-hd,drive=boot,bus=scsi.0,bootindex=0",
            ]
        if self.usb_image is not None:
            # snapshot=on: the flashed image stays byte-identical to the build output whatever the guest does.
            argv += [
                "-drive",
                f"if=none,id=usb,format=raw,snapshot=on,file={self.usb_image}",
                "-device",
                "usb-storage,bus=xhci.0,drive=usb,bootindex=0",
            ]
        for i, img in enumerate(self.nvme_images):
            argv += [
                "-drive",
                f"if=none,id=nvme{i},format=raw,file={img}",
                "-device",
                f"nvme,serial=rigbase{i},drive=nvme{i},bootindex={i + 1}",
            ]
        return argv + self.sata_args()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.monitor_path.unlink(missing_ok=True)
        self.tpm = TpmProcess(self.tpm_state, self.workdir)
        self.tpm.start()
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # QEMU binds the monitor before it runs the guest: once it is there, qmp() can be called at once.
        deadline = time.monotonic() + 30
        while not self.monitor_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                time.sleep(0.2)  # let the reader collect QEMU's last words
                self.close()
                raise RuntimeError(f"QEMU did not start: {self.text()[-2000:]}")
            time.sleep(0.05)

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        with (self.workdir / "console.log").open("ab") as log:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                self.output += chunk
                log.write(chunk)
                log.flush()

    def text(self, start: int = 0) -> str:
        return self.output[start:].decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match[str]:
        """Wait until `pattern` (a regex) appears in the console output after byte offset `start`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(_strip_ansi(self.text(start)))
            if m:
                return m
            if self.proc and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = _strip_ansi(self.text(start))[-3000:]
        raise ConsoleTimeout(f"console did not show /{pattern}/ within {timeout:.0f}s; last output:\n{tail}")

    def qmp(self, command: str, timeout: float = 30, **arguments: Any) -> Any:
        """Run one QMP command on the monitor socket and return its `return` value (events that arrive
        meanwhile are skipped). One connection per command: QMP serves one client at a time."""
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.monitor_path))
            reader = sock.makefile("rb")

            def reply() -> Any:
                while time.monotonic() < deadline:
                    line = reader.readline()
                    if not line:
                        break
                    msg = json.loads(line)
                    if "error" in msg:
                        raise MonitorError(f"QMP {command}: {msg['error'].get('desc', msg['error'])}")
                    if "return" in msg:
                        return msg["return"]
                raise MonitorError(f"QMP {command}: no answer from {self.monitor_path}")

            greeting = json.loads(reader.readline() or b"{}")
            if "QMP" not in greeting:
                raise MonitorError(f"no QMP greeting on {self.monitor_path}: {greeting}")
            sock.sendall(b'{"execute": "qmp_capabilities"}\n')
            reply()
            request: dict[str, Any] = {"execute": command}
            if arguments:
                request["arguments"] = arguments
            sock.sendall(json.dumps(request).encode() + b"\n")
            return reply()

    def system_reset(self) -> None:
        """A reset the guest did not ask for (the reset button): same QEMU, same disks (NVMe and SATA
        written in place, the USB image's snapshot kept), same TPM state; the TPM itself is reset."""
        self.qmp("system_reset")

    def through_firmware(self, start: int, stall: float = 300, timeout: float = 600) -> None:
        """After a reboot (the guest's own or system_reset()), wait until the firmware has started the boot
        loader (`BdsDxe: starting`). Under TCG, OVMF after a warm reset with an installed NVMe drive is slow
        and erratic: seconds from power-on to the boot loader, about a minute after a warm reset, sometimes
        over 5 min, and it has been seen to print `BdsDxe: loading` and then nothing. A firmware that has
        not started the boot loader after `stall` seconds gets one power cycle, as an operator would give a
        hung machine; then it has `timeout` seconds."""
        try:
            self.wait_for(r"BdsDxe: starting", stall, start)
        except ConsoleTimeout:
            log.warning("the firmware did not start the boot loader within %.0f s: power cycle", stall)
            mark = len(self.output)
            self.power_cycle()
            self.wait_for(r"BdsDxe: starting", timeout, mark)

    def power_cycle(self) -> None:
        """Power off and on: QEMU and swtpm stop and start again on the same disk files, OVMF variables and
        TPM state; the console output keeps accumulating (take a mark first). The USB image's snapshot (the
        guest's writes to it) is dropped, as on a real power cycle of a read-only stick."""
        self.close()
        self.start()

    def send(self, text: str) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.tpm:
            self.tpm.stop()
        self.monitor_path.unlink(missing_ok=True)

    def __enter__(self) -> Machine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def blank_disk(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def minion_id_from_ek_cert(der: bytes) -> str:
    """What the banner must show: the shared derivation (contracts/identity.py) applied to the EK
    certificate's public key, so the boot test checks that the node's TPM-side derivation agrees."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from contracts.identity import minion_id_from_spki

    spki = (
        x509.load_der_x509_certificate(der)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return minion_id_from_spki(spki)
