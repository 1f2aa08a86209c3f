"""`provision lab up --control-planes N` (N > 1): the lab's control plane in the scale-out shape of
docs/control-plane.md "Several hosts", built from the same parts an operator deploys.

- PostgreSQL: one cluster the lab owns (PG_DIR), reached through its Unix socket only. It listens on no
  TCP port, so every host's namespace reaches it through the file system and nothing else reaches it.
- Hosts: `provision serve` in namespace rigbase-lab-hostK at 10.77.0.(60+K), each with `--peer-address`,
  so a job's URL answers through whichever host holds its node's tunnel. Host 1's home is the lab's home,
  where serve makes the deployment's CA and the admin token. The other hosts' homes (lab/hosts/hostK) get
  copies of the CA and of the secret key, as a deployment's hosts must share them.
- HAProxy (Debian's) in rigbase-lab-cp at 10.77.0.2:8470, the address the bundle names, configured by
  haproxy.py as in production. It also listens on a loopback socket of the host's namespace that the lab
  makes and hands over (`bind fd@N`). That is the URL plain `provision …` commands use, so the operator's
  commands go through the balancer as the minions' beats do, and the host gets no new interface.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from contracts.errors import Unavailable
from provisioner.adapters.secrets import Sealer
from provisioner.adapters.tls import TlsFiles
from provisioner.client import Client, ControlPlaneError, read_client_config, write_client_config
from provisioner.lab import netns
from provisioner.lab.haproxy import HaproxyConfig
from provisioner.lab.state import LabState, Proc, lab_dir, spawn
from provisioner.lab.topology import CP_PORT, HostPlan, HostRole, LabPlan, address, netns_name

Progress = Callable[[str], None]

# One lab per machine (its namespaces have fixed names), so its cluster has a fixed place too. Not under the
# lab's home: that is private to root (0700), and PostgreSQL runs as its own user.
PG_DIR: Final = Path("/var/lib/rigbase-lab/postgres")
PG_PORT: Final = 5432  # names the socket file only: the cluster listens on no TCP port
DATABASE: Final = "rigbase"
PG_USER: Final = "postgres"
# each serve process holds a pool of 10 + 10 and the leader's lock connection (docs/control-plane.md)
PG_MAX_CONNECTIONS: Final = 150
START_TIMEOUT_S: Final = 60.0
SHARED_FILES: Final = ("tls/ca.pem", "tls/ca.key", "secret.key")  # what every host of one deployment holds
TOOLS: Final = {"haproxy": "haproxy"}
BIN: Final = Path(sys.executable).parent  # provision of this installation


def missing_packages() -> list[str]:
    """The Debian packages a lab of several control planes needs that this machine lacks."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if _pg_bin() is None:
        missing.append("postgresql")
    return missing


def database_url() -> str:
    return f"postgresql+psycopg://{PG_USER}@/{DATABASE}?host={PG_DIR}&port={PG_PORT}"


def host_home(state: LabState, host: HostPlan) -> Path:
    return Path(state.home) if host.k == 1 else lab_dir(Path(state.home)) / "hosts" / host.name


# -- PostgreSQL ------------------------------------------------------------------------------------------


def _pg_bin() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian: /usr/lib/postgresql/VERSION/bin)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3].split(".")[0])
    )
    return found[-1].parent if found else None


def _pg(*argv: str) -> None:
    pg_bin = _pg_bin()
    if pg_bin is None:
        raise Unavailable("PostgreSQL is not installed: run scripts/install-deps.sh")
    done = subprocess.run(
        ["runuser", "-u", PG_USER, "--", str(pg_bin / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=PG_DIR,
        timeout=START_TIMEOUT_S,
    )
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise Unavailable(
            f"PostgreSQL's {argv[0]} failed ({why[-1] if why else done.returncode}): see {PG_DIR / 'log'}, "
            "then `provision lab down --yes` and retry"
        )


def _ensure_postgres(state: LabState, progress: Progress) -> None:
    if state.postgres is not None and state.postgres.alive():
        return
    data = PG_DIR / "data"
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(PG_DIR, ignore_errors=True)  # a half-made cluster of a crashed run
        PG_DIR.mkdir(parents=True, mode=0o700)
        user = pwd.getpwnam(PG_USER)
        os.chown(PG_DIR, user.pw_uid, user.pw_gid)
        _pg("initdb", "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8")
        progress(f"PostgreSQL cluster: {data}")
    options = f"-c listen_addresses= -k {PG_DIR} -p {PG_PORT} -c max_connections={PG_MAX_CONNECTIONS}"
    _pg("pg_ctl", "-D", str(data), "-o", options, "-l", str(PG_DIR / "log"), "-w", "start")
    pid = int((data / "postmaster.pid").read_text().split()[0])
    state.postgres = Proc.of("postgres", pid)
    state.save()
    import psycopg  # the store's PostgreSQL driver

    with psycopg.connect(
        host=str(PG_DIR), port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    ) as c:
        if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
            c.execute(f'CREATE DATABASE "{DATABASE}"')
    progress(f"PostgreSQL: database {DATABASE} on the Unix socket in {PG_DIR} (pid {pid})")


def remove_postgres() -> bool:
    """Stop the lab's cluster and delete it; whether there was one. Safe on a crashed lab's leftovers."""
    if not PG_DIR.exists():
        return False
    if (PG_DIR / "data" / "postmaster.pid").exists():
        with contextlib.suppress(Unavailable):  # one that is not running: its files go all the same
            _pg("pg_ctl", "-D", str(PG_DIR / "data"), "-m", "fast", "-w", "stop")
    shutil.rmtree(PG_DIR)
    with contextlib.suppress(OSError):  # its parent, when nothing else is in it
        PG_DIR.parent.rmdir()
    return True


# -- hosts -----------------------------------------------------------------------------------------------


def _answers(url: str, ca: Path, within_s: float) -> bool:
    """Whether the control plane at `url` answers /healthz within `within_s` (run inside a namespace)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            Client(url, None, timeout=1, ca=ca).get("/healthz")
            return True
        except ControlPlaneError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def _log_tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " / ".join(lines[-3:]) or "nothing logged"


def _share_keys(first: Path, home: Path) -> None:
    """A host's home gets the deployment's CA and secret key (docs/control-plane.md "Several hosts")."""
    (home / "tls").mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    for name in SHARED_FILES:
        shutil.copy2(first / name, home / name)


def _start_host(state: LabState, host: HostPlan, env: Mapping[str, str], progress: Progress) -> None:
    home = host_home(state, host)
    if host.k == 1:
        Sealer(home / "secret.key").ensure_key()  # made now, so the other hosts can get a copy
    else:
        _share_keys(Path(state.home), home)
    log = lab_dir() / f"serve-{host.name}.log"
    ns = netns.Netns(host.netns)
    argv = [
        *(str(BIN / "provision"), "serve", "--host", host.address, "--port", str(CP_PORT)),
        *("--database", database_url()),
        # its certificate names the balancer's address (what minions dial), its own (what the balancer's
        # checks and the other hosts' relays dial) and loopback (the operator's URL through the balancer)
        *("--advertise", address(HostRole.CP), "--advertise", host.address, "--peer-address", host.address),
    ]
    state.hosts[host.name], proc = spawn(
        "serve", ["nsenter", f"--net={ns.path}", "--", *argv], log, env={**env, "RIGBASE_HOME": str(home)}
    )
    state.save()
    url, ca = f"https://{host.address}:{CP_PORT}", TlsFiles(Path(state.home) / "tls").ca_cert
    deadline = time.monotonic() + START_TIMEOUT_S
    # the CA exists once host 1 has started; until then its answer is read without one and refused
    while not (ca.exists() and ns.call(_answers, url, ca, 1.0, timeout=10)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise Unavailable(f"control-plane {host.name} did not start ({_log_tail(log)}): see {log}")
    progress(f"control-plane {host.name}: {url} (home {home})")


# -- the balancer ----------------------------------------------------------------------------------------


def _start_balancer(plan: LabPlan, state: LabState, progress: Progress) -> None:
    if state.haproxy is not None:
        state.haproxy.stop()
    loopback = socket.create_server(("127.0.0.1", 0))  # in the host's namespace: the operator's URL
    port = loopback.getsockname()[1]
    ca = TlsFiles(Path(state.home) / "tls").ca_cert
    config = lab_dir() / "haproxy.cfg"
    config.write_text(
        HaproxyConfig(
            f"{address(HostRole.CP)}:{CP_PORT}",
            [f"{h.address}:{CP_PORT}" for h in plan.host_plans()],
            str(ca),
            "localhost",
            also_listen=[f"fd@{loopback.fileno()}"],
        ).render()
    )
    log = lab_dir() / "haproxy.log"
    ns = netns.Netns(netns_name(HostRole.CP))
    argv = ["nsenter", f"--net={ns.path}", "--", "haproxy", "-f", str(config), "-db"]
    try:
        state.haproxy, _ = spawn("haproxy", argv, log, pass_fds=[loopback.fileno()])
    finally:
        loopback.close()
    state.host_url = f"https://127.0.0.1:{port}"
    state.lan_url = plan.cp_lan_url
    state.save()
    if not _answers(state.host_url, ca, START_TIMEOUT_S):
        raise Unavailable(f"HAProxy did not answer on {state.host_url} ({_log_tail(log)}): see {log}")
    # plain `provision …` commands in the lab's home reach the balancer, not host 1 (which wrote its own URL)
    client_json = Path(state.home) / "client.json"
    token = read_client_config(client_json).get("token")
    if token is None:
        raise Unavailable(f"{client_json} holds no admin token: run `provision lab down --yes` and retry")
    write_client_config(state.host_url, token, client_json, ca=str(ca))
    progress(
        f"HAProxy: {state.host_url} for you, {state.lan_url} on the lab LAN, in front of "
        f"{', '.join(h.name for h in plan.host_plans())}"
    )


def ensure(plan: LabPlan, state: LabState, env: Mapping[str, str], progress: Progress) -> None:
    """Make what is missing of the shape: the cluster, each host that is not running, the balancer."""
    _ensure_postgres(state, progress)
    for host in plan.host_plans():
        running = state.hosts.get(host.name)
        if running is None or not running.alive():
            _start_host(state, host, env, progress)
    ca = TlsFiles(Path(state.home) / "tls").ca_cert
    healthy = state.host_url is not None and _answers(state.host_url, ca, 0)
    if state.haproxy is None or not state.haproxy.alive() or not healthy:
        _start_balancer(plan, state, progress)


def stop(state: LabState) -> list[str]:
    """Stop the balancer and the hosts (the cluster after them: remove_postgres); what was stopped."""
    stopped = []
    for name, proc in [("haproxy", state.haproxy), *state.hosts.items()]:
        if proc is not None:
            proc.stop()
            stopped.append(f"{proc.kind} {name} {proc.pid}")
    return stopped
