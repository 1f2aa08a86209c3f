"""`minion run`: the node agent's main loop (the contract `provision lab` and the finalize playbook's
systemd unit rely on).

1. Check the hardware requirements (this machine, or `--inventory FILE`) — the report travels with the
   join so the operator sees the verdict in `provision node pending`.
2. Join: retried with backoff while the control plane is unreachable, the minion is pending (no node
   added yet), refused, or its node is errored; every change of state is printed as one line.
3. Keep the node credential and the AK in the state dir (0600), then heartbeat forever: report actual
   state, apply the desired state through minion/desired.py handlers, answer quote nonces (continuous
   attestation). A node sent back to `new` (operator retry) or a rejected credential means join again.
4. SIGTERM/SIGINT: stop, run the shutdown hooks (handlers clean up, e.g. mDNS goodbyes), exit 0.
"""

from __future__ import annotations

import base64
import importlib
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contracts.heartbeat_keys import HeartbeatKey
from contracts.messages import HeartbeatRequest, HeartbeatResponse, QuoteMessage
from minion import desired
from minion.device_key import DeviceKey
from minion.join.client import (
    ConnectionProblem,
    ControlPlane,
    Enrollment,
    attempt_join,
    attempt_key_join,
    beat_idle_s,
)
from minion.join.state import StateDir
from minion.settings import ContainerSettings
from minion.watchdog import Watchdog

if TYPE_CHECKING:
    from minion.gpu.keeper import CdiKeeper

# Modules whose `setup(context: RunContext)` is called once before the first heartbeat (e.g. to start
# the reservations agent and register its desired-state handler and shutdown hook). One line each.
RUN_HOOKS: list[str] = [
    "minion.reservations.heartbeat",  # desired["upnp"], ["reservations"]: mDNS, UPnP (docs/reservations.md)
    "minion.finalize.agent",  # desired["finalize"]: on-node finalize (docs/finalize.md)
    # desired["gpu_health"]: NVML facts and health; the CDI spec the two below use (before them)
    "minion.gpu.agent",
    "minion.jobs.agent",  # desired["jobs"]: job containers with podman (docs/minion-jobs.md)
    "minion.devices.agent",  # desired["device_config"]: a device's inference container (docs/devices.md)
]


# the longest wait between two watchdog pings while the loop sleeps (well inside the unit's WatchdogSec)
WATCHDOG_SLICE_S = 30.0


@dataclass
class RunContext:
    enrollment: Enrollment
    state: StateDir
    tcti: str | None
    inventory: dict[str, Any]
    node: dict[str, Any] = field(default_factory=dict)
    # `--host-root DIR`: a lab node's root; finalize runs in a chroot of it (None: on this machine)
    host_root: Path | None = None
    # MinionSettings.ansible_collections: where finalize finds community.general (None: the default search)
    ansible_collections: Path | None = None
    # MinionSettings.lan_address: the address mDNS answers from (None: the multicast route's)
    lan_address: str | None = None
    # MinionSettings.event_log: the firmware's TCG event log, sent with every quote when readable
    event_log: Path | None = None
    # MinionSettings.jobs: how job containers run (runtime, cgroups, ulimits, network, CDI); None: defaults
    jobs: ContainerSettings | None = None
    # `--device-key`: a device without a TPM proves itself with the key in the state dir, not a TPM
    device_key: bool = False
    # the node's NVIDIA CDI spec, kept by minion.gpu.agent; None: GPUs of another kind
    gpu_spec: CdiKeeper | None = None


def _maintenance(value: Any) -> bool:
    """Nothing to stop yet on the node itself (jobs come later); acknowledge the mode."""
    return bool(value)


@dataclass
class HeldDesired:
    """The desired state last received and its revision, which the next request names: an answer that
    leaves `desired` out means "the one you hold" (docs/join-protocol.md, Heartbeat)."""

    state: dict[str, Any] | None = None
    revision: str | None = None

    def take(self, answer: HeartbeatResponse) -> dict[str, Any] | None:
        """The desired state to apply for this answer; None when it names none this minion holds."""
        if answer.desired is not None:
            # an answer without a revision (an older control plane's) is not kept: the next is whole too
            self.revision = answer.desired_revision
            self.state = answer.desired if self.revision else None
            return answer.desired
        return self.state


class Printer:
    """One line per change of state (not per attempt), so a lab log stays readable."""

    def __init__(self, state: StateDir, out: Callable[[str], None] | None = None) -> None:
        self.state = state
        self.last: tuple[str, str | None] | None = None
        self.out = out or (lambda line: print(line, flush=True))

    def __call__(self, state: str, message: str | None = None, **extra: Any) -> None:
        if self.last is None or state != self.last[0] or (message and message != self.last[1]):
            self.last = (state, message or (self.last[1] if self.last and state == self.last[0] else None))
            self.out(f"{state}: {message}" if message else state)
            self.state.save_status(state, message, **extra)


def load_ak(session: Any, state: StateDir) -> Any:
    from minion.join.state import read_json, write_private
    from minion.tpm.session import AttestationKey

    saved = read_json(state.ak_file)
    if saved:
        try:
            return AttestationKey.from_dict(saved)
        except (KeyError, ValueError):
            pass
    ak = session.create_ak()
    write_private(state.ak_file, ak.to_dict())
    return ak


def _quote(tcti: str | None, ak: Any, nonce_b64: str, event_log: Path | None = None) -> QuoteMessage:
    from minion.join.attest import quote_message, read_event_log
    from minion.tpm.session import TpmSession

    with TpmSession(tcti) as session:
        return quote_message(session.quote(ak, base64.b64decode(nonce_b64)), read_event_log(event_log))


@dataclass
class Runner:
    ctx: RunContext
    requirements: dict[str, Any]
    heartbeat_s: float | None = None
    max_backoff_s: float = 15.0
    stop: threading.Event = field(default_factory=threading.Event)
    printer: Printer | None = None  # default: one line per state change into the state directory
    # pinged once per join attempt and per heartbeat: systemd restarts a minion whose loop stalls
    watchdog: Watchdog = field(default_factory=Watchdog.from_environment)

    def __post_init__(self) -> None:
        self.say: Printer = self.printer or Printer(self.ctx.state)
        self.cp = ControlPlane(self.ctx.enrollment)

    # -- join ----------------------------------------------------------------------------------------
    def join(self) -> dict[str, Any] | None:
        from minion.join.attest import read_event_log

        backoff = 0.5
        self.say("joining", f"{self.ctx.enrollment.control_plane_url} region {self.ctx.enrollment.region}")
        while not self.stop.is_set():
            try:
                if self.ctx.device_key:
                    outcome = attempt_key_join(
                        self.cp,
                        DeviceKey.load_or_create(self.ctx.state.path),
                        inventory=self.ctx.inventory,
                        requirements=self.requirements,
                    )
                else:
                    from minion.tpm.session import TpmSession  # not loaded on a device without a TPM

                    with TpmSession(self.ctx.tcti) as session:
                        ak = load_ak(session, self.ctx.state)
                        outcome = attempt_join(
                            self.cp,
                            session,
                            ak,
                            inventory=self.ctx.inventory,
                            requirements=self.requirements,
                            event_log=read_event_log(self.ctx.event_log),
                        )
            except ConnectionProblem as exc:
                self.say("unreachable", str(exc))
            else:
                if outcome.state == "joined":
                    node = {
                        **outcome.node,
                        "control_plane_url": self.ctx.enrollment.control_plane_url,
                        "region": self.ctx.enrollment.region,
                    }
                    self.ctx.state.save_node(node)
                    self.say(node.get("state", "joined"), outcome.message, node_id=node.get("node_id"))
                    return node
                self.say(outcome.state, outcome.message, code=outcome.code)
            self.pause(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)
        return None

    # -- heartbeat -----------------------------------------------------------------------------------
    def heartbeats(self, node: dict[str, Any]) -> None:
        """Until stopped, or until the node must join again (return)."""
        from minion.join.state import read_json

        interval = self.heartbeat_s or float(node.get("heartbeat_interval_s") or 30)
        self.cp.keep_idle(beat_idle_s(interval))  # one connection from beat to beat
        actual: dict[str, Any] = {}
        nonce: str | None = None
        held = HeldDesired()
        while not self.stop.is_set():
            quote, signature = None, None
            if nonce and self.ctx.device_key:
                key = DeviceKey.load_or_create(self.ctx.state.path)
                signature = key.heartbeat_signature(node["node_id"], nonce)
            elif nonce:
                ak = read_json(self.ctx.state.ak_file)
                from minion.tpm.session import AttestationKey

                quote = _quote(self.ctx.tcti, AttestationKey.from_dict(ak or {}), nonce, self.ctx.event_log)
            body = HeartbeatRequest(
                actual=actual, quote=quote, key_signature=signature, desired_revision=held.revision
            ).to_wire()
            try:
                response = self.cp.post(
                    f"/v1/nodes/{node['node_id']}/heartbeat", body, token=node["node_credential"]
                )
            except ConnectionProblem as exc:
                self.say("unreachable", str(exc))
                self.pause(min(interval, self.max_backoff_s))
                continue
            if response.status_code in (401, 404):
                self.ctx.state.forget_node()
                self.say("rejoining", response.json().get("message") if response.content else None)
                return
            if response.status_code != 200:
                self.say("heartbeat-refused", response.text[:200])
                self.pause(interval)
                continue
            try:
                answer = HeartbeatResponse.model_validate_json(response.content)
            except ValidationError as exc:
                self.say("heartbeat-refused", f"unreadable heartbeat answer: {exc.error_count()} problem(s)")
                self.pause(interval)
                continue
            self.say(answer.state, answer.reason, node_id=node["node_id"])
            if answer.state == "new":  # retried by the operator: attest again
                self.ctx.state.forget_node()
                return
            current = held.take(answer)
            if current is None:  # "unchanged" though this minion named no revision: not an answer to act on
                self.say("heartbeat-refused", "heartbeat answer without a desired state")
                self.pause(interval)
                continue
            actual = desired.apply(current)
            nonce = answer.quote_nonce
            self.pause(0 if nonce else interval)

    def pause(self, seconds: float) -> None:
        """Wait (until stopped) between attempts; the loop came round, so tell the watchdog, and keep
        telling it through a long wait (an operator's heartbeat interval may exceed WatchdogSec)."""
        self.watchdog.alive()
        remaining = seconds
        while remaining > 0 and not self.stop.is_set():
            step = min(remaining, WATCHDOG_SLICE_S)
            if self.stop.wait(step):
                return
            remaining -= step
            self.watchdog.alive()

    def run(self) -> None:
        desired.register(HeartbeatKey.MAINTENANCE, _maintenance)
        for module in RUN_HOOKS:  # light: each keeps its heavy libraries (zeroconf) inside its functions
            importlib.import_module(module).setup(self.ctx)
        self.watchdog.start()
        try:
            while not self.stop.is_set():
                node = self.ctx.state.node() or self.join()
                if node is None:
                    break
                self.ctx.node = node
                self.heartbeats(node)
        finally:
            # the watchdog stays armed through the hooks: a hook that hangs is aborted and shown like a loop
            errors = desired.shutdown()
            for error in errors:
                print(f"warning: shutdown hook failed: {error}", file=sys.stderr)
            self.cp.close()
            self.watchdog.stop()
            self.say("stopped")


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def collect_report(
    inventory_file: Path | None,
    storage_mode: str | None,
    public_jobs: bool,
    host_root: Path | None = None,
    catalogue_file: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inventory, requirement report) as JSON; a machine whose inventory cannot be read still joins
    with an empty report (the control plane then shows the verdict as unknown). `host_root` is where
    /proc is read (`--host-root`, as for `minion check`): a simulated node's RAM and cores."""
    import typer

    try:
        from minion.hardware.commands import load_or_collect
        from minion.hardware.requirements import check

        inventory = load_or_collect(inventory_file, host_root, catalogue_file)
        report = check(inventory, storage_mode, public_jobs)
        return inventory.to_json(), report.to_json()
    except SystemExit:
        raise
    except typer.Exit:
        if inventory_file is not None or host_root is not None:
            raise  # the operator's --inventory / --host-root is unusable: load_or_collect said why (exit 2)
        print(
            "warning: this machine's /proc cannot be read; joining without a hardware inventory",
            file=sys.stderr,
        )
        return {}, {}
    except Exception as exc:
        print(
            f"warning: no hardware inventory ({type(exc).__name__}: {exc}); joining without it",
            file=sys.stderr,
        )
        return {}, {}
