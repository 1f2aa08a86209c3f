"""The GPU proof's checks (scripts/gpu-check.sh runs this with the checkout's venv): one PASS/FAIL line
each, the minion's own code for everything it can, no network.

1. inventory: `minion inventory --json` names the GPU and its memory from NVML;
2. cdi: the spec the minion writes for this driver (minion/gpu), every host path in it present;
3. container: a customer's worker container as the minion starts it (RunPlan: user namespace, dropped
   capabilities, `--device nvidia.com/gpu=0`), in which `nvidia-smi -L` lists the GPU and a CUDA
   driver-API program (cuda_probe.c: cuInit, cuDeviceGetName, cuMemAlloc, memcpy there and back) works;
4. nvml: NVML samples of that GPU while the probe loads it (utilisation, memory, temperature, power)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from contracts.jobs import UserNamespace, WorkerAssignment  # noqa: E402
from minion.gpu import cdi  # noqa: E402
from minion.gpu.driver import NoDriver, discover  # noqa: E402
from minion.gpu.nvml import driver_view  # noqa: E402
from minion.jobs.container import RunPlan, auth_document, write_env_file, write_private  # noqa: E402
from minion.jobs.podman import Podman, PodmanError  # noqa: E402
from minion.settings import ContainerSettings  # noqa: E402

IMAGE = "localhost/rigbase-gpu-check:1"
LOAD_S = 20
failed = False


def report(ok: bool, check: str, detail: str) -> None:
    global failed
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {check}: {detail}", flush=True)


def check_inventory() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "minion"), "inventory", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        report(
            False, "inventory", out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "exit status"
        )
        return
    facts = json.loads(out.stdout)
    gpus = facts.get("gpus") or []
    notes = "; ".join(facts.get("notes") or [])
    if not gpus:
        report(False, "inventory", f"no GPU in the inventory ({notes or 'no note'})")
        return
    shown = ", ".join(
        f"{g.get('model')} {g.get('vram_bytes')} B, PCIe {g['link'].get('max_generation')} "
        f"x{g['link'].get('current_width')} {g.get('form_factor')} (sources {g.get('sources')})"
        for g in gpus
    )
    from_nvml = all(g.get("sources", {}).get("name") == "nvml" for g in gpus)
    report(
        from_nvml and "NVML" not in notes,
        "inventory",
        f"{len(gpus)} GPU(s): {shown}" + (f" ({notes})" if notes else ""),
    )
    print(json.dumps(gpus, indent=1))


def check_cdi() -> dict[str, Any] | None:
    try:
        driver = discover(Path("/"), nvml=driver_view())
    except NoDriver as exc:
        report(False, "cdi", str(exc))
        return None
    document = cdi.spec(driver)
    paths = [n["hostPath"] for n in document["containerEdits"].get("deviceNodes", [])]
    paths += [m["hostPath"] for m in document["containerEdits"]["mounts"]]
    paths += [n["hostPath"] for d in document["devices"] for n in d["containerEdits"]["deviceNodes"]]
    missing = [p for p in paths if not Path(p).exists()]
    written = cdi.write(document, Path("/var/run/cdi"))
    report(
        not missing,
        "cdi",
        f"driver {driver.version}, devices {[d['name'] for d in document['devices']]}, "
        f"{len(document['containerEdits']['mounts'])} mounts, written to {written}"
        + (f"; missing: {missing}" if missing else ""),
    )
    print(cdi.render(document))
    return document


def _image(probe: Path) -> None:
    """A tiny image from this machine's own sh and the probe (no registry here)."""
    files: dict[str, str] = {}
    for binary in ("/bin/sh", "/bin/cat", str(probe)):
        real = os.path.realpath(binary)
        files[f"bin/{Path(binary).name}"] = real
        out = subprocess.run(["ldd", real], capture_output=True, text=True).stdout
        files.update({lib.lstrip("/"): os.path.realpath(lib) for lib in re.findall(r"(/\S+)", out)})
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            for directory in ("tmp", "proc", "sys", "dev", "etc", "usr/bin", "lib/x86_64-linux-gnu"):
                info = tarfile.TarInfo(directory)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
                tar.addfile(info)
            for arcname, source in files.items():
                tar.add(source, arcname=arcname)
        with archive.open("rb") as data:
            subprocess.run(["podman", "import", "-", IMAGE], stdin=data, capture_output=True, check=True)


def _sample(stop: threading.Event, samples: list[dict[str, float]]) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(f"NVML: {exc}", flush=True)
        return
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not stop.is_set():
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(
                {
                    "gpu_pct": float(rates.gpu),
                    "memory_used_mib": memory.used / 2**20,
                    "temperature_c": float(
                        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                    ),
                    "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                }
            )
            stop.wait(1.0)
    finally:
        pynvml.nvmlShutdown()


def check_container(probe: Path | None) -> None:
    if shutil.which("podman") is None:
        report(False, "container", "podman is not installed here: the other checks ran")
        return
    if probe is None:
        report(False, "container", "no cuda_probe (gcc missing and none carried in): the other checks ran")
        return
    # no network needed, and none here
    settings = dataclasses.replace(ContainerSettings.from_env(os.environ), network="none")
    try:
        _image(probe)
    except (OSError, subprocess.CalledProcessError) as exc:
        report(False, "container", f"cannot make the check's image: {exc}")
        return
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    a = WorkerAssignment(
        job_id="gpu-check",
        job_name="gpu-check",
        worker=0,
        generation="g1",
        image=IMAGE,
        command=f"nvidia-smi -L; /bin/{probe.name} {LOAD_S}",
        gpu_count=1,
        cpus=1,
        memory_mb=1024,
        userns=UserNamespace.of_slot(1),
    )
    write_env_file(work / "env", {})
    write_private(work / "auth.json", auth_document(a))
    plan = RunPlan(
        "rigbase-gpu-check", "gpu-check", a, [0], [], work / "output.log", work / "env", work / "auth.json"
    )
    podman = Podman(settings)
    subprocess.run([*podman.base(), "rm", "--force", plan.name], capture_output=True)
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(stop, samples), daemon=True)
    try:
        podman.call(plan.args(settings), timeout=120)
        sampler.start()
        code = subprocess.run(
            [*podman.base(), "wait", plan.name], capture_output=True, text=True, timeout=180
        )
    except (PodmanError, subprocess.TimeoutExpired) as exc:
        report(False, "container", f"podman: {exc}")
        return
    finally:
        stop.set()
    log = (work / "output.log").read_text() if (work / "output.log").exists() else ""
    lines = [line.split(" ", 3)[-1] for line in log.splitlines()]  # k8s-file: time stream tag text
    print("\n".join(lines))
    listed = any(line.startswith("GPU 0:") for line in lines)
    cuda = any(line.startswith("cuda ok:") for line in lines)
    report(
        listed and cuda and code.stdout.strip() == "0",
        "container",
        f"exit {code.stdout.strip()}; nvidia-smi -L {'lists' if listed else 'does not list'} the GPU; "
        f"CUDA driver API {'works' if cuda else 'failed'}",
    )
    subprocess.run([*podman.base(), "rm", "--force", plan.name], capture_output=True)
    sampler.join(5)
    if not samples:
        report(False, "nvml", "no NVML sample was read while the probe ran")
        return
    peak = {k: max(s[k] for s in samples) for k in samples[0]}
    report(peak["memory_used_mib"] > 0, "nvml", f"{len(samples)} samples under load, peaks {peak}")


def check_health() -> None:
    """NVML's answers as the minion's GPU health reads them (recorded, to replay in the tests), and the
    state each GPU gets (minion/gpu/health.py)."""
    from minion.gpu.health import PynvmlReader, assess

    answers = PynvmlReader().read()
    record = Path(os.environ.get("GPU_CHECK_RECORD", tempfile.mkdtemp())) / "nvml-answers.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(answers.dump())
    health = assess(answers)
    print(health.model_dump_json(indent=1))
    states = ", ".join(f"GPU {g.index} {g.state.value}" for g in health.gpus) or "no GPU"
    report(
        not health.problem and bool(health.gpus), "health", f"{health.problem or states}; answers in {record}"
    )


def main() -> int:
    check_inventory()
    check_health()
    document = check_cdi()
    probe_env = os.environ.get("GPU_CHECK_PROBE")
    probe = Path(probe_env) if probe_env else None
    if probe is None and shutil.which("gcc"):
        probe = Path(tempfile.mkdtemp()) / "cuda_probe"
        source = Path(__file__).with_name("cuda_probe.c")
        subprocess.run(["gcc", "-O2", "-o", str(probe), str(source), "-ldl"], check=True)
    if document is None:
        report(False, "container", "no CDI spec, so no GPU to give a container")
        report(False, "nvml", "no driver to sample")
    else:
        check_container(probe)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
