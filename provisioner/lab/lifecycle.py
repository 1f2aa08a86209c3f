"""`provision lab up | status | down`: a whole region on one machine.

`up` converges towards the plan in topology.py; every step first looks at what exists (namespace,
process, control-plane object) and only makes what is missing, so running it twice changes nothing and
a run cut short is finished by the next one. `down` removes every namespace, process and file the lab
made, using the state file and, for leftovers of a crash, the fixed names and this home's lab paths.

Where the control plane listens, and why: `provision serve` runs in the host's network namespace on a
free loopback port (so plain `provision …` commands with the same RIGBASE_HOME reach it through the
client config it writes), and also accepts connections on a socket the lab creates *inside* the
`rigbase-lab-cp` namespace at 10.77.0.2:8470 and hands it over with `--fd`. A socket keeps the
namespace it was created in, so minions reach the control plane over the lab LAN while the host gets
no new interface, no route and no forwarder: nothing the lab does touches the host's interfaces.

How the lab talks to that control plane: as an operator, over its HTTP API with the admin token and the
`provision` commands' own client, and nothing else (each node's minion finalizes its own root).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.bundle import EnrollmentBundle, write_bundle
from contracts.errors import Conflict, RigbaseError, Unavailable
from provisioner.adapters.tls import TlsFiles
from provisioner.client import Client, ControlPlaneError, read_client_config
from provisioner.domain.states import NODE_READY, NODE_STOPPED
from provisioner.lab import control_planes, hardware, job_image, job_runtime, netns, notebook_image, rootfs
from provisioner.lab.state import (
    LabNodeRecord,
    LabState,
    Proc,
    claim_machine,
    default_home,
    lab_dir,
    machine_owner,
    release_machine,
    spawn,
    state_path,
)
from provisioner.lab.swtpm import Swtpm, VendorCA, create_vendor_ca, provision_swtpm
from provisioner.lab.topology import (
    CP_PORT,
    DEVICE_DEMO_MODEL,
    HARDWARE_PROFILE,
    HEARTBEAT_SECONDS,
    JOIN_RETRY_SECONDS,
    LAN_CIDR,
    NAME_PATTERN,
    NETNS_PREFIX,
    PROVIDER,
    REGION,
    STORAGE_NODE,
    DevicePlan,
    HostRole,
    LabPlan,
    NodePlan,
    address,
    netns_name,
)

Progress = Callable[[str], None]
# How the operator sees pending minions (the rows of GET /v1/pending-minions) in the progress: the CLI
# hands in its `provision node pending` table; this package returns data and prints nothing itself.
PendingView = Callable[[list[dict[str, Any]]], str]


BIN = Path(sys.executable).parent  # provision, minion and python of this installation
TOOLS = {
    "ip": "iproute2",
    "swtpm": "swtpm",
    "swtpm_setup": "swtpm-tools",
    "umockdev-run": "umockdev",
    "debootstrap": "debootstrap",
    # job containers (provisioner/lab/job_runtime.py): rootful podman, catatonit for its --init
    "podman": "podman",
    "catatonit": "catatonit",
}
UPNP_TOOLS = {"miniupnpd": "miniupnpd", "nft": "nftables"}
# the lab's control plane is its own: never the one an operator's environment points at
CLIENT_VARIABLES = ("RIGBASE_URL", "RIGBASE_TOKEN", "RIGBASE_DATABASE_URL")
KEEP_IN_HOME = {"cache"}  # the debootstrap'd base root: what makes a warm `lab up` fast
READY_STATES, FAILED_STATES = NODE_READY, NODE_STOPPED  # what `lab up` waits for, and gives up on


def _quiet(_: str) -> None:
    pass


def _minion_ids(rows: list[dict[str, Any]]) -> str:
    return "\n".join(str(r.get("minion_id")) for r in rows)


# -- preflight -------------------------------------------------------------------------------------------


def _preflight(plan: LabPlan, home: Path, state: LabState | None) -> None:
    """Refuse before anything is made: wrong user, missing tools, a home that holds something else."""
    if os.geteuid() != 0:
        raise Unavailable("provision lab up needs root to create network namespaces: run it with sudo")
    tools = TOOLS | (UPNP_TOOLS if plan.upnp else {})
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if plan.control_planes > 1:
        missing = sorted({*missing, *control_planes.missing_packages()})
    if missing:
        raise Unavailable(f"missing packages {', '.join(missing)}: run scripts/install-deps.sh")
    if state is None and (home / "client.json").exists():
        raise Conflict(
            f"{home} already belongs to a control plane (client.json): start the lab in its own "
            "home, e.g. RIGBASE_HOME=/var/tmp/rigbase-lab provision lab up"
        )
    if state is not None:
        _refuse_change(plan, state)
    recorded = set(state.namespaces) if state else set()
    foreign = sorted(
        n for n in netns.list_namespaces(NETNS_PREFIX) if NAME_PATTERN.match(n) and n not in recorded
    )
    if foreign:
        raise Conflict(_foreign_namespace(foreign[0], home))


def _refuse_change(plan: LabPlan, state: LabState) -> None:
    """What a lab that is up cannot become by another `lab up`."""
    have = len(state.nodes)
    if plan.nodes < have:
        raise Conflict(
            f"the lab has {have} nodes and cannot shrink to {plan.nodes}: "
            f"run `provision lab down --yes` first, or `provision lab up --nodes {have}`"
        )
    if plan.devices and state.storage_mode != "central":
        raise Conflict(
            f"the lab's region {REGION} uses local storage and devices need a central-storage region: "
            f"run `provision lab down --yes`, then `provision lab up --devices {plan.devices}`"
        )
    devices = sum(1 for n in state.nodes.values() if n.service == "device")
    if plan.devices < devices:
        raise Conflict(
            f"the lab has {devices} devices and cannot shrink to {plan.devices}: "
            f"run `provision lab down --yes` first, or `provision lab up --devices {devices}`"
        )
    if state.control_planes != plan.control_planes:
        raise Conflict(
            f"the lab is up with {state.control_planes} control plane(s), its store with them: "
            f"pass --control-planes {state.control_planes}, or `provision lab down --yes` first"
        )
    if state.upnp and not plan.upnp:
        raise Conflict(
            "the lab is up with a UPnP router: pass --upnp again, or `provision lab down --yes` first"
        )


def _foreign_namespace(name: str, home: Path) -> str:
    """Why `lab up` in `home` may not use namespace `name`, and the `lab down` that frees it."""
    owner = machine_owner()
    if owner is None or owner == home.resolve():
        return (
            f"namespace {name} exists but is not this lab's ({home}): another lab is up or one crashed; "
            "run `provision lab down --yes` with its RIGBASE_HOME (or this one, to clean up leftovers)"
        )
    if _orphaned(owner):
        return (
            f"namespace {name} is left over from a lab whose home {owner} is gone: "
            "run `provision lab down --yes` to clean it up"
        )
    return (
        f"namespace {name} belongs to the lab of {owner}: "
        f"run `RIGBASE_HOME={owner} provision lab down --yes` first"
    )


def _orphaned(owner: Path) -> bool:
    """A lab whose state file is gone with its home: nobody can `lab down` it but another home."""
    return not state_path(owner).exists()


def _orphan_of_another_home(home: Path) -> list[Path]:
    """The home of the machine's lab when that is not `home` and is gone: its leftovers are anyone's."""
    owner = machine_owner()
    return [owner] if owner and owner != home.resolve() and _orphaned(owner) else []


# -- network ---------------------------------------------------------------------------------------------


class _FixedNames(netns.Lab):
    """netns.Lab hands out random names; the lab's namespaces have fixed, documented ones."""

    def __init__(self, state: LabState) -> None:
        super().__init__("lab")
        self.state = state

    def netns(self, role: str) -> netns.Netns:
        return _create_netns(self.state, netns_name(HostRole(role)))


def _create_netns(state: LabState, name: str) -> netns.Netns:
    ns = netns.Netns(name)
    state.namespaces.append(name)  # recorded before it exists: a crash right now is still cleaned up
    state.save()
    return ns.create()


def _ensure_network(plan: LabPlan, state: LabState, progress: Progress) -> netns.VirtualLan:  # noqa: C901
    recorded = [n for n in state.namespaces if n in plan.namespaces() or NAME_PATTERN.match(n)]
    if any(not netns.Netns(n).exists() for n in recorded) or (
        netns_name(HostRole.LAN) in state.namespaces and len(state.lan_members) < len(recorded) - 1
    ):
        # after a reboot (/run/netns is a tmpfs) or a crash mid-attach: rebuild the whole LAN
        progress("rebuilding the lab network (some namespaces were missing)")
        _delete_namespaces(state)
        for node in state.nodes.values():
            node.minion = None
        state.miniupnpd = None
    lan_ns = netns.Netns(netns_name(HostRole.LAN))
    if lan_ns.name not in state.namespaces:
        _create_netns(state, lan_ns.name)
        lan_ns.ip("link", "add", "br0", "type", "bridge")
        lan_ns.ip("link", "set", "br0", "type", "bridge", "mcast_snooping", "0")  # a plain switch
        lan_ns.ip("link", "set", "br0", "up")
    lan = netns.VirtualLan(lan_ns, LAN_CIDR, members=dict(state.lan_members))
    members: list[tuple[str, int]] = [(netns_name(HostRole.CP), 2), (netns_name(HostRole.CLIENT), 3)]
    members += [
        (p.netns, int(p.address.rsplit(".", 1)[1])) for p in [*plan.member_plans(), *plan.host_plans()]
    ]
    made = []
    for name, host in members:
        if name in state.lan_members:
            continue
        ns = _create_netns(state, name) if name not in state.namespaces else netns.Netns(name)
        lan.attach(ns, host)
        state.lan_members = dict(lan.members)
        state.save()
        made.append(name)
    if plan.upnp and netns_name(HostRole.ROUTER) not in state.lan_members:
        router = netns.add_upnp_router(_FixedNames(state), lan, lab_dir() / "router")
        state.lan_members = dict(lan.members)
        state.miniupnpd = Proc.of("miniupnpd", router.process.pid) if router.process else None
        state.save()
        for name in [netns_name(HostRole.CLIENT)] + [p.netns for p in plan.member_plans()]:
            netns.Netns(name).add_route("default", via=router.lan_ip)
        made += [netns_name(HostRole.ROUTER), netns_name(HostRole.WAN)]
    elif plan.upnp:
        for name in made:  # nodes added to a lab that already has its router
            netns.Netns(name).add_route("default", via=address(HostRole.ROUTER))
    if made:
        progress(f"network: {', '.join(made)} on {LAN_CIDR} (bridge in {lan_ns.name})")
    return lan


def _delete_namespaces(state: LabState | None) -> list[str]:
    names = set(state.namespaces if state else [])
    names |= {n for n in netns.list_namespaces(NETNS_PREFIX) if NAME_PATTERN.match(n)}
    for name in sorted(names, key=lambda n: n == netns_name(HostRole.LAN)):  # the bridge last
        netns.Netns(name).delete()
    if state:
        state.namespaces, state.lan_members = [], {}
    return sorted(names)


def _listen_in(ns_name: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket created inside namespace `ns_name` (setns moves only this helper thread)."""
    box: dict[str, Any] = {}

    def make() -> None:
        try:
            netns.setns(netns.NETNS_DIR / ns_name)
            box["sock"] = socket.create_server((host, port))
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if "error" in box:
        raise Unavailable(
            f"cannot listen on {host}:{port} in {ns_name} ({box['error']}): "
            "run `provision lab down --yes` and retry"
        )
    return box["sock"]


# -- control plane ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ca(state: LabState) -> Path:
    """The control-plane CA `provision serve` made in the lab's home: the operator side and the
    minions (through the bundle) trust only it."""
    return TlsFiles(Path(state.home) / "tls").ca_cert


def _healthy(url: str, ca: Path) -> bool:
    try:
        Client(url, None, timeout=1, ca=ca).get("/healthz")
    except ControlPlaneError:
        return False
    return True


def _serve_environment(state: LabState) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES}
    # RIGBASE_PUBLIC_URL: the URL finalize writes into each node's minion.yaml (the LAN one, not loopback)
    env |= {
        "RIGBASE_HOME": state.home,
        "TSS2_LOG": "all+none",
        "RIGBASE_PUBLIC_URL": f"https://{address(HostRole.CP)}:{CP_PORT}",
    }
    # a lab's data may come from this machine (a bucket of a local MinIO, a web server): loopback is allowed
    env.setdefault("RIGBASE_SOURCE_NETWORKS", "127.0.0.0/8,::1/128")
    return env


def _ensure_control_plane(plan: LabPlan, state: LabState, progress: Progress) -> None:
    if plan.control_planes > 1:  # several hosts on PostgreSQL behind HAProxy
        control_planes.ensure(plan, state, _serve_environment(state), progress)
        return
    if state.serve and state.serve.alive() and state.host_url and _healthy(state.host_url, _ca(state)):
        return
    if state.serve:
        state.serve.stop()
    lan_sock = _listen_in(netns_name(HostRole.CP), address(HostRole.CP), CP_PORT)
    port = _free_port()
    argv = [
        *(str(BIN / "provision"), "serve", "--host", "127.0.0.1", "--port", str(port)),
        *("--database", f"sqlite:///{lab_dir() / 'rigbase.db'}", "--fd", str(lan_sock.fileno())),
        # the certificate names the LAN address minions dial (and loopback, always)
        *("--advertise", address(HostRole.CP)),
    ]
    try:
        state.serve, proc = spawn(
            "serve",
            argv,
            lab_dir() / "serve.log",
            env=_serve_environment(state),
            pass_fds=[lan_sock.fileno()],
        )
    finally:
        lan_sock.close()
    state.host_url, state.lan_url = f"https://127.0.0.1:{port}", f"https://{address(HostRole.CP)}:{CP_PORT}"
    state.save()
    deadline = time.monotonic() + 60
    while not _healthy(state.host_url, _ca(state)):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (lab_dir() / "serve.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise Unavailable(
                f"the lab's control plane did not start ({' / '.join(tail)}): see {lab_dir() / 'serve.log'}"
            )
        time.sleep(0.1)
    progress(
        f"control plane: {state.host_url} for you, {state.lan_url} on the lab LAN "
        f"(SQLite {lab_dir() / 'rigbase.db'})"
    )


def _client(state: LabState) -> Client:
    """The operator API of the lab's control plane, with the admin token `provision serve` wrote."""
    token = read_client_config(Path(state.home) / "client.json").get("token")
    return Client(state.host_url or "", token, timeout=10, ca=_ca(state))


def _ensure_region(state: LabState, ca: VendorCA, progress: Progress) -> Path:
    """Trust the lab's TPM vendor CA, enable the physical provider, create region `lab`; the bundle.
    Each is the API call the matching `provision …` command makes."""
    client = _client(state)
    if not any(p["kind"] == PROVIDER for p in client.get("/v1/providers")["items"]):
        client.post("/v1/providers", {"kind": PROVIDER, "payment_mode": None})
    if not any(r["name"] == REGION for r in client.get("/v1/regions")["items"]):
        # No public jobs (the lab's region is the smallest rule set). Nodes read the profile's /proc through
        # `minion run --host-root` (RAM, cores); every other rule reads the umockdev sysfs.
        # A lab with devices (`--devices`) is central: devices need a central-storage region whose storage
        # node (node-1) is active (docs/devices.md); the mode of a region never changes afterwards.
        client.post(
            "/v1/regions",
            {"name": REGION, "provider": PROVIDER, "storage_mode": state.storage_mode, "public_jobs": False},
        )
        progress(f"region: {REGION} (provider {PROVIDER}, storage mode {state.storage_mode}, no public jobs)")
    marker = lab_dir() / "tpm-ca" / ".trusted"
    if not marker.exists():
        for pem in (ca.root_certificate, ca.intermediate_certificate):
            client.post("/v1/tpm-cas", {"pem": pem.read_text()})
        marker.touch()
        progress(f"TPM vendor CA trusted: {ca.root_certificate}")
    bundle = lab_dir() / "bundle.json"
    if not bundle.exists():
        body = {"control_plane_url": state.lan_url, "ca_certificate": None, "ttl": "7d"}
        answer = client.post(f"/v1/regions/{REGION}/bundle", body)
        write_bundle(bundle, EnrollmentBundle.model_validate(answer))
        progress(f"enrollment bundle: {bundle}")
    return bundle


# -- nodes -----------------------------------------------------------------------------------------------


def _node_dir(name: str, home: Path | None = None) -> Path:
    return lab_dir(home) / "nodes" / name


def _profile_of(node: LabNodeRecord) -> str:
    return node.profile or HARDWARE_PROFILE


def _record(plan: LabPlan, p: NodePlan | DevicePlan) -> LabNodeRecord:
    """A new node's or device's record; its service and profile are fixed when it is first planned."""
    service = "device" if isinstance(p, DevicePlan) else "compute"
    if plan.devices and p.name == STORAGE_NODE:
        service = "storage"
    return LabNodeRecord(
        p.k, p.name, p.netns, p.address, service=service, profile=p.profile if service == "device" else None
    )


def _has_tpm(node: LabNodeRecord) -> bool:
    """Whether the node's profile has a TPM (every node and Orin; not the Xavier, which uses a device key)."""
    return "tpm" in hardware.load_profile(_profile_of(node))


def _prepare_node(plan: NodePlan | DevicePlan, node: LabNodeRecord, ca: VendorCA) -> Swtpm | None:
    """Its own swtpm (EK certificate from the lab's vendor CA), started, where its profile has a TPM; its
    minion_id (asked of the node's own `minion id`, as an operator reads it off the banner: from the TPM,
    or from the device key its minion creates in its state dir); its hardware."""
    tpm = None
    if _has_tpm(node):
        tpm = provision_swtpm(_node_dir(plan.name) / "swtpm", ca)
        tpm.start()
    if node.minion_id is None:
        node.minion_id = _minion_id(
            [*_identity_args(tpm), "--state-dir", str(_node_dir(node.name) / "minion")]
        )
    hardware.write_testbed(hardware.load_profile(_profile_of(node)), _node_dir(plan.name) / "hardware")
    return tpm


def _identity_args(tpm: Swtpm | None) -> list[str]:
    """How the node's minion proves itself: its swtpm, or (no TPM) the device key in its state dir."""
    return ["--tcti", tpm.tcti] if tpm is not None else ["--device-key"]


def _minion_id(identity: list[str]) -> str:
    proc = subprocess.run(
        [str(BIN / "minion"), "id", *identity, "--json"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise Unavailable(f"`minion id` failed on the lab node ({proc.stderr.strip()}): see the swtpm log")
    return str(json.loads(proc.stdout)["minion_id"])


def _start_minion(
    node: LabNodeRecord, tpm: Swtpm | None, bundle: Path, region_cache: Path | None = None
) -> None:
    """`region_cache`: the directory a compute node or device of a central region reads its objects from,
    the lab's stand-in for the storage node's cache export that a real node mounts over NFS (the kernel's
    NFS client cannot run here, docs/lab.md)."""
    d = _node_dir(node.name)
    if node.root is None:
        raise Unavailable(f"{node.name} has no lab root yet: `provision lab down`, then `lab up` again")
    # the node's debootstrap'd root is its --host-root: /proc files of the profile for the inventory,
    # and the tree the minion's own finalize chroots into (rigbase_lab=true)
    profile = hardware.load_profile(_profile_of(node))
    root = hardware.write_host_root(profile, Path(node.root))
    if "jetson" in profile:  # a simulated Jetson: its device tree, chip id and L4T release in its root
        hardware.write_jetson_files(profile, root)
    record = d / "hardware" / f"{_profile_of(node)}.umockdev"
    argv = [
        "umockdev-run",
        "-d",
        str(record),
        "--",
        str(BIN / "minion"),
        "run",
        "--bundle",
        str(bundle),
        *_identity_args(tpm),
        "--state-dir",
        str(d / "minion"),
        "--heartbeat-interval",
        str(HEARTBEAT_SECONDS),
        "--max-backoff",
        str(JOIN_RETRY_SECONDS),
        "--host-root",
        str(root),
    ]  # the profile's RAM and cores, not this machine's; and the root the minion finalizes in a chroot
    (d / "minion").mkdir(parents=True, exist_ok=True)
    (d / "cache").mkdir(exist_ok=True)  # the node's region cache (`cache` mounts of its jobs)
    gpus = hardware.gpu_count(profile)
    if gpus:
        job_runtime.write_cdi_spec(node.netns, gpus)
    if node.service == "device":
        # its inference container asks for `nvidia.com/gpu=all`; and a model to mount (`--model lab-demo`:
        # a directory of the device's region cache, docs/devices.md "In the lab")
        job_runtime.write_l4t_cdi_spec()
        demo = d / "cache" / "models" / DEVICE_DEMO_MODEL
        demo.mkdir(parents=True, exist_ok=True)
        (demo / "README").write_text("the lab's stand-in model directory (provision lab up --devices)\n")
    jobs_env = job_runtime.minion_environment(
        netns=node.netns,
        node_dir=d,
        objects=region_cache if region_cache is not None and node.service in ("compute", "device") else None,
        runtime=job_runtime.runtime_settings(job_runtime.HostFacts.read(), os.environ),
        gpus=gpus,
    )
    env = job_runtime.environ_without_rigbase() | jobs_env | {"TSS2_LOG": "all+none"}
    ns = netns.Netns(node.netns)
    with open(d / "minion.log", "ab") as log:
        # only the network namespace (nsenter --net), not `ip netns exec`: that also remounts /sys in a
        # mount namespace of its own, which hides the cgroup mounts from the podman the minion runs
        proc = subprocess.Popen(
            ["nsenter", f"--net={ns.path}", "--", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    node.minion = Proc.of("minion", proc.pid)  # nsenter execs umockdev-run, which forwards SIGTERM
    node.started_at = time.time()


def _ensure_nodes(plan: LabPlan, state: LabState, ca: VendorCA, bundle: Path, progress: Progress) -> None:
    for p in plan.member_plans():
        state.nodes.setdefault(p.name, _record(plan, p))
    todo = [(p, state.nodes[p.name]) for p in plan.member_plans()]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:  # swtpm_setup ~1 s each
        tpms = list(pool.map(lambda pn: _prepare_node(pn[0], pn[1], ca), todo))
    started = []
    storage = next((n for n in state.nodes.values() if n.service == "storage"), None)
    region_cache = _node_dir(storage.name) / job_runtime.OBJECTS_UNDER if storage is not None else None
    for (_, node), tpm in zip(todo, tpms, strict=True):
        if node.minion and node.minion.alive():
            continue
        _start_minion(node, tpm, bundle, region_cache)
        started.append(f"{node.name} {node.minion_id} in {node.netns} ({node.address})")
    state.save()
    for line in started:
        progress(f"minion started: {line}")


def _check_minions(state: LabState, nodes: list[LabNodeRecord]) -> None:
    """A minion that exited will never join: say so at once, with the end of its log."""
    for node in nodes:
        if node.minion and not node.minion.alive():
            log = _node_dir(node.name) / "minion.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-2:] if log.exists() else []
            raise Unavailable(
                f"the minion of {node.name} exited ({' / '.join(tail) or 'no output'}): "
                f"see {log}, "
                "then run `provision lab up` again"
            )


def _show_pending(
    state: LabState, todo: list[LabNodeRecord], progress: Progress, view: PendingView, timeout: float
) -> None:
    """Wait until every new minion shows up as pending, then show the operator's view of them."""
    want = {n.minion_id or "" for n in todo}  # set by _prepare_node before any minion starts
    client = _client(state)
    deadline = time.monotonic() + timeout
    while True:
        seen = {r.get("minion_id") for r in client.get("/v1/pending-minions", region=REGION)["items"]}
        if want <= seen:
            break
        _check_minions(state, todo)
        if time.monotonic() > deadline:
            logs = ", ".join(str(_node_dir(n.name) / "minion.log") for n in todo if n.minion_id not in seen)
            raise Unavailable(
                f"minions {', '.join(sorted(want - seen))} did not show up as pending within "
                f"{timeout:.0f} s: see {logs}"
            )
        time.sleep(0.25)
    rows = client.get("/v1/pending-minions", region=REGION)["items"]
    progress("pending minions (what `provision node pending` shows):\n" + view(rows).rstrip())


def _order(node: LabNodeRecord) -> tuple[bool, int]:
    """Nodes first (node-1 …), then devices (device-1 …)."""
    return (node.service == "device", node.k)


def _add_nodes(state: LabState, progress: Progress, services: set[str]) -> list[LabNodeRecord]:
    """Adopt each minion of these services by its minion_id, as `provision node add` does (POST /v1/nodes;
    a device as `provision device add` does, the same call with service `device`). Each minion then
    finalizes its own root (`minion run --host-root`): the control plane needs no path."""
    client = _client(state)
    existing = {n["name"] for n in client.pages("/v1/nodes", region=REGION)}
    added = []
    for node in sorted(state.nodes.values(), key=_order):
        if node.name in existing or node.service not in services:
            continue
        body: dict[str, Any] = {
            "name": node.name,
            "region": REGION,
            "minion_id": node.minion_id or "",
            "hostname": f"{node.name}.{REGION}.rigbase.test",
            "upnp": state.upnp,
        }
        if node.service != "compute":  # storage (node-1 of a lab with devices) or device
            body["service"] = node.service
        node_id = client.post("/v1/nodes", body)["id"]
        node.added_at = time.time()
        state.save()
        added.append(node)
        what = {"compute": "", "storage": " as the storage node", "device": f" as a device ({node.profile})"}
        progress(
            f"added {node.name}{what.get(node.service, '')} ({node_id}) by minion_id {node.minion_id}, "
            f"root {node.root}"
        )
    return added


def _wait_ready(state: LabState, progress: Progress, timeout: float) -> None:
    client = _client(state)
    shown: dict[str, str] = {}
    started = time.monotonic()
    while True:
        nodes = {n["name"]: n for n in client.pages("/v1/nodes", region=REGION)}
        for name, node in sorted(nodes.items()):
            if shown.get(name) != node["state"]:
                shown[name] = node["state"]
                progress(f"{name}: {node['state']}" + (f" ({node['reason']})" if node.get("reason") else ""))
            lab_node = state.nodes.get(name)
            if lab_node and node["state"] in READY_STATES and lab_node.ready_at is None:
                lab_node.ready_at = time.time()
                state.save()
            if node["state"] in FAILED_STATES:
                raise RigbaseError(
                    f"{name} is {node['state']}: {node.get('reason') or '-'}; see "
                    f"`provision node history {name}` and {_node_dir(name) / 'minion.log'}"
                )
        # only what was added: devices wait for the storage node (added after the nodes are ready)
        waiting = [
            n
            for n, lab_node in state.nodes.items()
            if lab_node.added_at is not None and nodes.get(n, {}).get("state") not in READY_STATES
        ]
        if not waiting:
            return
        _check_minions(state, [state.nodes[n] for n in waiting])
        if time.monotonic() - started > timeout:
            raise Unavailable(
                f"{', '.join(waiting)} did not reach maintenance within {timeout:.0f} s: "
                f"see `provision lab status` and the minion logs under {lab_dir() / 'nodes'}"
            )
        time.sleep(0.5)


# -- up / status / down ----------------------------------------------------------------------------------


def up(
    plan: LabPlan,
    *,
    progress: Progress = _quiet,
    pending: PendingView = _minion_ids,
    timeout: float = 600,
    home: Path | None = None,
) -> LabState:
    home = home or default_home()
    state = LabState.load(home)
    _preflight(plan, home, state)
    if state is None:
        state = LabState(
            home=str(home),
            upnp=plan.upnp,
            storage_mode=plan.storage_mode,
            control_planes=plan.control_planes,
            home_entries_before=sorted(e for e in os.listdir(home)),
        )
    state.upnp = plan.upnp
    lab_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    state.save()
    claim_machine(home)  # before the first namespace: a lab killed from here on is known by its home
    started = time.monotonic()
    step = lambda msg: progress(f"[{time.monotonic() - started:6.1f} s] {msg}")  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # debootstrap (~40 s cold, cached afterwards) and the job image made of it (~7 s, once per base)
        # run while the network, TPMs and minions come up
        base = pool.submit(rootfs.ensure_base, log=lab_dir() / "debootstrap.log")
        image = pool.submit(_ensure_job_image, base, step)
        _ensure_network(plan, state, step)
        ca = create_vendor_ca(lab_dir() / "tpm-ca")
        _ensure_control_plane(plan, state, step)
        bundle = _ensure_region(state, ca, step)
        # each minion finalizes itself in a chroot of its root: the roots exist before the minions start
        for p in plan.member_plans():
            state.nodes.setdefault(p.name, _record(plan, p))
        if any(n.root is None for n in state.nodes.values()):
            if not base.done():
                step("waiting for the cached Debian root (debootstrap, first run only)")
            base_root = base.result()
            for node in state.nodes.values():
                if node.root is None:
                    root = rootfs.node_root(node.name)
                    node.root = str(root if root.exists() else rootfs.clone(base_root, root))
            state.save()
        if not all(_has_tpm(n) for n in state.nodes.values()):
            # what `provision region update lab --allow-devices-without-tpm` does
            _client(state).post(f"/v1/regions/{REGION}/attestation", {"allow_devices_without_tpm": True})
            step(f"region {REGION} allows devices without a TPM (the Xavier's device key)")
        _ensure_nodes(plan, state, ca, bundle, step)
        _adopt_new(state, step, pending, timeout)
        image.result()
    _wait_ready(state, step, timeout)
    step("all nodes in maintenance" if plan.devices == 0 else "all nodes ready (the storage node active)")
    if any(n.service == "device" and n.added_at is None for n in state.nodes.values()):
        _add_nodes(state, step, {"device"})
        _wait_ready(state, step, timeout)
        step("all devices active")
    return state


def _adopt_new(state: LabState, step: Progress, pending: PendingView, timeout: float) -> None:
    """Add the nodes not added yet: the storage node first, and the compute nodes once it is active (a
    central region refuses them until then; devices come after every node is ready)."""
    new = [n for n in state.nodes.values() if n.added_at is None]
    if not new:
        return
    _show_pending(state, new, step, pending, timeout)
    if _add_nodes(state, step, {"storage"}):
        _wait_ready(state, step, timeout)
        step("the storage node is active")
    _add_nodes(state, step, {"compute"})


def _ensure_job_image(base: concurrent.futures.Future[Path], progress: Progress) -> str:
    """The lab's job image, imported from the cached Debian root once per root (job_image.py)."""
    started = time.monotonic()
    runtime = job_runtime.runtime_settings(job_runtime.HostFacts.read(), os.environ)
    image_id, imported = job_image.ensure_image(
        base.result(), podman=runtime.get(job_runtime.PODMAN) or "podman"
    )
    how = (
        f"imported from the cached Debian root in {time.monotonic() - started:.1f} s"
        if imported
        else "present"
    )
    progress(f"job image: {job_image.IMAGE} ({image_id[:12]}, {how})")
    return image_id


def ensure_notebook_image(progress: Progress = _quiet) -> tuple[str, str, bool]:
    """The lab's notebook image (notebook_image.py), built over the job image once per base and
    requirement. Returns (its name, its id, whether it was built now)."""
    started = time.monotonic()
    podman = job_runtime.runtime_settings(job_runtime.HostFacts.read(), os.environ).get(job_runtime.PODMAN)
    cache = rootfs.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    image_id, built = notebook_image.ensure_notebook_image(
        job_image.IMAGE, podman=podman or "podman", lock_dir=cache
    )
    how = f"built in {time.monotonic() - started:.1f} s" if built else "present"
    progress(f"notebook image: {notebook_image.IMAGE} ({image_id[:12]}, {how})")
    return notebook_image.IMAGE, image_id, built


def _stray_processes(home: Path) -> list[int]:
    """Processes whose command line names this lab's directory: what a crashed `lab up` left running."""
    needle = str(lab_dir(home))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(needle.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def status(home: Path | None = None) -> dict[str, Any]:
    home = home or default_home()
    state = LabState.load(home)
    present = [n for n in netns.list_namespaces(NETNS_PREFIX) if NAME_PATTERN.match(n)]
    owner = machine_owner()
    if state is None:
        return {
            "up": False,
            "home": str(home),
            "namespaces": present,
            "owner": str(owner) if present and owner else None,  # whose lab those namespaces are
            "processes": [],
            "nodes": [],
        }
    procs = [
        {"kind": p.kind, "pid": p.pid, "alive": p.alive(), "node": None}
        for p in (state.serve, state.haproxy, state.postgres, state.miniupnpd)
        if p
    ]
    procs += [{"kind": p.kind, "pid": p.pid, "alive": p.alive(), "node": h} for h, p in state.hosts.items()]
    for node in state.nodes.values():
        tpm = Swtpm(_node_dir(node.name, home) / "swtpm")
        if _has_tpm(node):
            procs.append(
                {"kind": "swtpm", "pid": tpm.pid(), "alive": tpm.pid() is not None, "node": node.name}
            )
        if node.minion:
            procs.append(
                {"kind": "minion", "pid": node.minion.pid, "alive": node.minion.alive(), "node": node.name}
            )
    nodes: list[dict[str, Any]] = []
    reachable = bool(state.host_url and _healthy(state.host_url, _ca(state)))
    if reachable:
        nodes = list(_client(state).pages("/v1/nodes", region=REGION))
    order = {name: _order(node) for name, node in state.nodes.items()}
    nodes.sort(key=lambda row: (order.get(row["name"], (True, len(order) + 1)), row["name"]))
    for row in nodes:
        lab = state.nodes.get(row["name"])
        if lab:
            row |= {
                "profile": lab.profile,
                "netns": lab.netns,
                "address": lab.address,
                "lab_root": lab.root,
                "join_seconds": (
                    round(lab.ready_at - lab.added_at, 1) if lab.ready_at and lab.added_at else None
                ),
            }
    return {
        "up": True,
        "home": str(home),
        "upnp": state.upnp,
        "storage_mode": state.storage_mode,
        "control_planes": state.control_planes,
        "host_url": state.host_url,
        "lan_url": state.lan_url,
        "control_plane_reachable": reachable,
        "namespaces": [
            {"name": n, "exists": netns.Netns(n).exists(), "address": state.lan_members.get(n)}
            for n in state.namespaces
        ],
        "processes": procs,
        "nodes": nodes,
    }


def down(*, progress: Progress = _quiet, home: Path | None = None) -> dict[str, Any]:  # noqa: C901
    """Remove everything the lab made. Safe to run on a half-built or crashed lab, and twice."""
    home = home or default_home()
    state = LabState.load(home)
    removed: dict[str, Any] = {"namespaces": [], "processes": [], "containers": [], "files": []}
    minions = [n.minion for n in (state.nodes.values() if state else []) if n.minion]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:  # goodbyes need up to a second each
        list(pool.map(lambda p: p.stop(), minions))
    removed["processes"] += [f"minion {p.pid}" for p in minions]
    # job containers outlive their minion by design (it adopts them when it restarts): the lab's go now,
    # before the namespaces they share
    runtime = job_runtime.runtime_settings(job_runtime.HostFacts.read(), os.environ)
    for node_dir in sorted((lab_dir(home) / "nodes").glob("*")):
        owner = job_runtime.owner_of(node_dir)
        if owner:
            removed["containers"] += job_runtime.remove_containers(owner, runtime)
    removed["cdi_specs"] = [str(p) for p in job_runtime.remove_cdi_specs()]
    if state and state.miniupnpd:
        state.miniupnpd.stop()
        removed["processes"].append(f"miniupnpd {state.miniupnpd.pid}")
    if state:
        removed["processes"] += control_planes.stop(state)
    if control_planes.remove_postgres():  # also a crashed lab's cluster, found by its fixed place
        removed["processes"].append("postgres")
    removed["namespaces"] = _delete_namespaces(state)
    for tpm_dir in sorted((lab_dir(home) / "nodes").glob("*/swtpm")):
        Swtpm(tpm_dir).stop()
        removed["processes"].append(f"swtpm {tpm_dir.parent.name}")
    if state and state.serve:
        state.serve.stop()
        removed["processes"].append(f"serve {state.serve.pid}")
    # an orphan's processes (a lab whose home was deleted under it: a killed test run's temporary home)
    # are found by its path as this home's are; nothing else can still stop them
    homes = [home] + _orphan_of_another_home(home)
    for pid in [pid for h in homes for pid in _stray_processes(h)]:  # also: a crash before a pid was saved
        Proc.of("stray", pid).stop()
        removed["processes"].append(f"stray {pid}")
    for root in sorted((lab_dir(home) / "roots").glob("*")):
        rootfs.remove_root(root, require_marker=False)
    # datastore roots a minion mounted for its jobs (in the host's mount namespace: minions enter only the
    # network namespace) are unmounted before the tree is deleted, never deleted through
    for h in homes:
        rootfs.unmount_under(lab_dir(h))
    before = set(state.home_entries_before) if state else set(os.listdir(home)) - {"lab"}
    for entry in sorted(set(os.listdir(home)) - before - KEEP_IN_HOME):
        path = home / entry
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        removed["files"].append(str(path))
    left_ns = [n for n in netns.list_namespaces(NETNS_PREFIX) if NAME_PATTERN.match(n)]
    left_procs = [pid for h in homes for pid in _stray_processes(h)]
    left_procs += [p.pid for p in (state.processes() if state else []) if p.alive()]
    if left_ns or left_procs or state_path(home).exists():
        raise Unavailable(
            f"lab down left namespaces {left_ns or '-'} and processes {left_procs or '-'}: "
            "run `provision lab down --yes` again"
        )
    for h in homes:
        release_machine(h)
    progress(
        f"removed {len(removed['namespaces'])} namespaces, {len(removed['processes'])} processes, "
        f"{len(removed['containers'])} job containers, {len(removed['files'])} entries of {home} "
        "(kept: the rootfs cache and the job image)"
    )
    return removed
