"""A QEMU (TCG) machine for booting the image: OVMF, a swtpm, the USB image on xHCI and blank NVMe drives,
and a serial-console driver. Used by the boot tests and the benchmark; KVM hangs on these hosts, so TCG.

One QEMU at a time on a shared 2-core host: the caller owns the instance and must close() it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


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


@dataclass
class Machine:
    workdir: Path
    usb_image: Path | None
    nvme_images: list[Path]
    tpm_state: Path
    memory_mb: int = 1536
    proc: subprocess.Popen | None = None
    tpm: TpmProcess | None = None
    output: bytearray = field(default_factory=bytearray)
    _reader: threading.Thread | None = None

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
            "-nic",
            "none",
            "-display",
            "none",
            "-monitor",
            "none",
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
        return argv

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
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
