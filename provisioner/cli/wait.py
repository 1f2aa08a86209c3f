"""`--wait`: poll a resource until its state reaches one of `done`, showing progress on stderr.

`poll` is the one loop (GET, read the state, stop on done / failed / timeout); `wait_for_state` shows
it as a Rich status line for plain resources, and the GCP commands print one line per change of the
VM's progress (provisioner/cli/gcp.py), which stays readable in CI logs. `wait_for_node` says, on a
timeout, whether the node's minion ever called (pending, refused and why) and the full next command."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from provisioner.cli.common import fail
from provisioner.client import Client
from provisioner.domain.states import NodeState

Answer = dict[str, Any]
# (what the errors call it, its state, the state's detail: a progress line or a reason) of one answer
Read = Callable[[Answer], tuple[str, str, str | None]]
# told the name, state, detail and seconds waited so far, after every answer
Show = Callable[[str, str, str | None, float], None]
# told the last answer and the seconds waited, answers the timeout's one line (what happened, what next)
Explain = Callable[[Answer, float], str]


def poll(
    client: Client,
    path: str,
    read: Read,
    *,
    done: Collection[str],
    failed: Collection[str] = (),
    timeout: float,
    show: Show,
    interval: float = 1.0,
    explain: Explain | None = None,
    **params: Any,
) -> Answer:
    """GET `path` until its state is in `done` (the answer is returned); refused (exit 1) naming the state
    when it lands in `failed`, or when `timeout` seconds pass (`explain` words that refusal)."""
    started = time.monotonic()
    while True:
        answer = client.get(path, **params)
        name, state, detail = read(answer)
        show(name, state, detail, time.monotonic() - started)
        if state in done:
            return answer
        if state in failed:
            fail(f"{name} is {state}: {detail or 'see its history'}")
        if time.monotonic() - started > timeout:
            if explain is not None:
                fail(explain(answer, time.monotonic() - started))
            fail(f"{name} is still {state} after {timeout:.0f} s: check it later with `show`")
        time.sleep(interval)


def wait_for_state(
    client: Client,
    path: str,
    *,
    done: Collection[str],
    failed: Collection[str] = (),
    timeout: float,
    interval: float = 1.0,
    explain: Explain | None = None,
    **params: Any,
) -> Answer:
    """A resource answering {name, state, reason}, shown as one Rich status line."""
    from rich.console import Console

    def read(obj: Answer) -> tuple[str, str, str | None]:
        return obj.get("name", path), obj.get("state", "?"), obj.get("reason")

    with Console(stderr=True).status("waiting") as status:

        def show(name: str, state: str, _detail: str | None, elapsed: float) -> None:
            status.update(f"{name}: {state} ({elapsed:.0f} s)")

        return poll(
            client,
            path,
            read,
            done=done,
            failed=failed,
            timeout=timeout,
            show=show,
            interval=interval,
            explain=explain,
            **params,
        )


def wait_for_node(
    client: Client,
    node: Answer,
    *,
    done: Collection[str],
    failed: Collection[str],
    timeout: float,
    interval: float = 1.0,
) -> Answer:
    """Wait for a node; on a timeout, say what its minion did and the full command to go on with."""

    def explain(last: Answer, waited: float) -> str:
        return node_timeout(client, last, waited)

    return wait_for_state(
        client,
        f"/v1/nodes/{node['id']}",
        done=done,
        failed=failed,
        timeout=timeout,
        interval=interval,
        explain=explain,
    )


def node_timeout(client: Client, node: Answer, waited: float) -> str:
    """One line: the node's state after `waited` s, whether its minion ever called the control plane
    (pending, or refused and why: /v1/pending-minions, /v1/join-refusals), and the next command."""
    name, region, minion = node["name"], node["region"], node["minion_id"]
    watch = f"provision node show {name} --region {region} --watch"
    head = f"node '{name}' ({node['id']}) is still {node['state']} after {waited:.0f} s"
    pending = [
        row
        for row in client.get("/v1/pending-minions", region=region)["items"]
        if row.get("minion_id") == minion
    ]
    refusals = client.get("/v1/join-refusals", minion_id=minion, limit=1)["items"]
    if refusals:
        last = refusals[0]
        return (
            f"{head}: its minion {minion} called and was refused at {last.get('at')}: {last.get('reason')}: "
            f"see `provision node refusals --minion-id {minion}`, fix that, then `{watch}`"
        )
    if pending:
        return (
            f"{head}: its minion {minion} is pending in region {pending[0]['region']} "
            f"(requirements: {pending[0].get('requirements')}): `{watch}`"
        )
    if node.get("last_heartbeat_at") or node["state"] != NodeState.NEW:
        return f"{head}: its minion {minion} has called and the node is on its way: `{watch}`"
    return (
        f"{head}: its minion {minion} has never called the control plane: boot the node from media of "
        f"region {region} (`provision region bundle {region} -o bundle.json`), check it reaches "
        f"{client.url}, then `{watch}`"
    )
