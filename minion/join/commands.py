"""`minion join` (one attempt, or --wait) and `minion run` (the agent: join, then heartbeat forever)."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from minion.hardware.commands import HostRoot, InventoryFile
from minion.settings import BUNDLE_ENV, JOIN_TOKEN_ENV, TCTI_ENV, MinionSettings
from minion.tpm.commands import DeviceKeyFlag

Bundle = Annotated[
    Path | None,
    typer.Option(
        "--bundle",
        dir_okay=False,
        envvar=BUNDLE_ENV,
        help="The region enrollment bundle (provision region bundle).",
    ),
]
Url = Annotated[str | None, typer.Option("--control-plane", help="Control plane URL (instead of --bundle).")]
Token = Annotated[
    str | None,
    typer.Option("--join-token", envvar=JOIN_TOKEN_ENV, help="Region join token (with --control-plane)."),
]
Tcti = Annotated[
    str | None,
    typer.Option("--tcti", envvar=TCTI_ENV, help="tpm2-tss TCTI string, e.g. swtpm:path=/run/tpm.sock."),
]
StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        file_okay=False,
        help="Where the node credential and AK live (default $RIGBASE_STATE_DIR, else "
        "/var/lib/rigbase/minion).",
    ),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _enrollment(bundle: Path | None, url: str | None, token: str | None, config: Path | None = None) -> Any:
    from minion.join.client import Enrollment, EnrollmentError

    if bundle is not None:
        try:
            return Enrollment.from_bundle(bundle)
        except EnrollmentError as exc:
            raise _fail(str(exc), 2) from None
    if url is None and config is not None:
        url = _config(config).get("control_plane_url")
    if not url:
        raise _fail("no control plane: pass --bundle FILE, or --control-plane URL with --join-token", 2)
    return Enrollment(url, token, _config(config).get("region") if config else None)


def _config(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise _fail(f"cannot read {path} ({exc}); re-run the finalize playbook or pass --bundle", 2) from None
    return data if isinstance(data, dict) else {}


def join_command(
    ctx: typer.Context,
    bundle: Bundle = None,
    control_plane: Url = None,
    join_token: Token = None,
    tcti: Tcti = None,
    state_dir: StateOpt = None,
    inventory_file: InventoryFile = None,
    host_root: HostRoot = None,
    device_key: DeviceKeyFlag = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Join the region once: attest with the TPM (or prove the device key); prints joined, pending or
    the refusal."""
    os.environ.setdefault("TSS2_LOG", "all+none")
    from minion.device_key import DeviceKey, DeviceKeyUnusable
    from minion.join.attest import read_event_log
    from minion.join.client import ConnectionProblem, ControlPlane, attempt_join, attempt_key_join
    from minion.join.run import collect_report, load_ak
    from minion.join.state import StateDir
    from minion.tpm.errors import TpmError  # plain exceptions: loads no TPM library

    settings = MinionSettings.of(ctx)
    enrollment = _enrollment(bundle, control_plane, join_token)
    if not enrollment.join_token:
        raise _fail("no join token: pass --bundle FILE or --join-token TOKEN", 2)
    state = StateDir(state_dir or settings.state_dir)
    inventory, report = collect_report(
        inventory_file, enrollment.storage_mode, enrollment.public_jobs, host_root, settings.gpu_catalogue
    )
    cp = ControlPlane(enrollment)
    try:
        if device_key:
            key = DeviceKey.load_or_create(state.path)
            outcome = attempt_key_join(cp, key, inventory=inventory, requirements=report)
        else:
            from minion.tpm.session import TpmSession

            with TpmSession(tcti) as session:
                outcome = attempt_join(
                    cp,
                    session,
                    load_ak(session, state),
                    inventory=inventory,
                    requirements=report,
                    event_log=read_event_log(settings.event_log),
                )
    except (ConnectionProblem, DeviceKeyUnusable, TpmError) as exc:
        raise _fail(str(exc)) from None
    finally:
        cp.close()
    if outcome.state == "joined":
        state.save_node(
            {**outcome.node, "control_plane_url": enrollment.control_plane_url, "region": enrollment.region}
        )
    state.save_status(outcome.state, outcome.message, code=outcome.code)
    if json_output:
        shown = {k: v for k, v in outcome.node.items() if k != "node_credential"}
        print(
            json.dumps(
                {"state": outcome.state, "message": outcome.message, "code": outcome.code, "node": shown}
            )
        )
    else:
        print(f"{outcome.state}: {outcome.message}")
    if outcome.state in ("refused", "errored"):
        raise typer.Exit(1)


def run_command(
    ctx: typer.Context,
    bundle: Bundle = None,
    control_plane: Url = None,
    join_token: Token = None,
    tcti: Tcti = None,
    state_dir: StateOpt = None,
    inventory_file: InventoryFile = None,
    host_root: HostRoot = None,
    heartbeat_interval: Annotated[
        float | None,
        typer.Option(
            "--heartbeat-interval",
            min=0.05,
            help="Seconds between heartbeats (default: the control plane's, 30).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", dir_okay=False, help="minion.yaml written by the finalize playbook."),
    ] = None,
    max_backoff: Annotated[
        float, typer.Option("--max-backoff", min=0.1, help="Longest wait between join attempts (s).")
    ] = 15.0,
    device_key: DeviceKeyFlag = False,
) -> None:
    """Run the agent: check requirements, join (retrying while pending), then heartbeat until SIGTERM."""
    os.environ.setdefault("TSS2_LOG", "all+none")
    from minion.join.run import RunContext, Runner, collect_report, install_signal_handlers
    from minion.join.state import StateDir

    settings = MinionSettings.of(ctx)
    enrollment = _enrollment(bundle, control_plane, join_token, config)
    if heartbeat_interval is None and config is not None and _config(config).get("heartbeat_seconds"):
        heartbeat_interval = float(_config(config)["heartbeat_seconds"])
    state = StateDir(state_dir or settings.state_dir)
    if not enrollment.join_token and state.node() is None:
        raise _fail(f"no node credential in {state.path} and no join token: pass --bundle FILE", 2)
    inventory, report = collect_report(
        inventory_file, enrollment.storage_mode, enrollment.public_jobs, host_root, settings.gpu_catalogue
    )
    failing = [r.get("rule") for r in report.get("rules", []) if not r.get("ok", True)]
    if failing:
        print(
            f"requirements: FAIL {', '.join(map(str, failing))} "
            "(the join will be refused; `minion check` explains)",
            flush=True,
        )
    stop = threading.Event()
    install_signal_handlers(stop)
    runner = Runner(
        RunContext(
            enrollment,
            state,
            tcti,
            inventory,
            host_root=host_root,
            ansible_collections=settings.ansible_collections,
            lan_address=settings.lan_address,
            event_log=settings.event_log,
            jobs=settings.jobs,
            device_key=device_key,
        ),
        report,
        heartbeat_interval,
        max_backoff,
        stop,
    )
    runner.run()


def register(app: typer.Typer) -> None:
    app.command("join")(join_command)
    app.command("run")(run_command)
