"""`provision job …`: create (any of the three spec formats; --dry-run shows the match table the way
ChainOpera Launch does, and without --yes the CLI asks [y/N]), list, show, history, stop, logs, metrics,
usage, convert.
Jobs are named by name (the newest of that name) or id, always within this token's account (docs/jobs.md)."""

from __future__ import annotations

import csv
import json
import re
import ssl
import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from contracts.jobspec import ModelRef, SpecError
from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, Json, Yes, fail, group, output_options, read_input, show_one
from provisioner.cli.settings import connect
from provisioner.domain import job_formats
from provisioner.domain.placement_rows import MATCH_HEADERS, MatchRow

app = group("Jobs: containers on your fleet's nodes, from a spec to their result.")
FOLLOW_EVERY_S = 1.0


def _gpus(row: dict[str, Any]) -> str:
    count, kind = row["gpu_count"], row["gpu_type"]
    if not count:
        return "-"
    return f"{count}x {kind}" if kind else str(count)


def _duration(row: dict[str, Any]) -> str:
    seconds = row.get("duration_s")
    return "-" if seconds is None else render.human_duration(seconds)


COLUMNS: render.Columns = [
    ("id", "ID"),
    ("name", "NAME"),
    ("project", "PROJECT"),
    ("type", "TYPE"),
    ("state", "STATE"),
    ("node", "NODE"),
    ("gpus", "GPUS", _gpus),
    ("price_per_gpu_hour", "PRICE/GPU-H"),
    ("duration_s", "DURATION", _duration),
    ("credits_so_far", "CREDITS"),
    ("created_at", "AGE", render.ago("created_at")),
    ("reason", "REASON"),
]
WIDE = [("region", "REGION"), ("created_by", "CREATED BY")]
WORKER_COLUMNS = [
    ("index", "WORKER"),
    ("group", "GROUP"),
    ("node", "NODE"),
    ("port", "PORT"),
    ("state", "STATE"),
    ("exit_code", "EXIT"),
    ("gpu_indices", "GPUS"),
    ("reason", "REASON"),
]
HISTORY_COLUMNS = [
    ("at", "WHEN"),
    ("actor", "WHO"),
    ("name", "WHAT"),
    ("from_state", "FROM"),
    ("to_state", "TO"),
    ("reason", "WHY"),
]
SHOW_FIELDS = [
    "id",
    "name",
    "project",
    "type",
    "state",
    "reason",
    "url",
    "autostop_minutes",
    "region",
    "node",
    "gpu_type",
    "gpu_count",
    "price_per_gpu_hour",
    "duration_s",
    "credits",
    "credits_so_far",
    "credits_per_hour",
    "created_by",
    "created_at",
    "started_at",
    "ended_at",
]
Name = Annotated[str, typer.Argument(help="Job name (the newest job of that name) or id.")]
SpecFile = Annotated[
    Path,
    typer.Option(
        "--file",
        "-f",
        help="Job spec: rigbase YAML/JSON, a ChainOpera Launch job.yaml, an OpenPAI job JSON or a trainML "
        "job form (- reads stdin).",
    ),
]
ProjectOpt = Annotated[
    str | None,
    typer.Option(
        "--project",
        "-p",
        help="Project name or id, or OWNER/PROJECT shared with you (default: your account's default).",
    ),
]


def _read_spec(path: Path) -> job_formats.ParsedSpec:
    """The spec a file holds, or every error on its own line (`error: FIELD: …`) and exit 2."""
    text = read_input(path, "a job spec file", called="spec file")
    try:
        return job_formats.read(text, None if str(path) == "-" else path.name)
    except SpecError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None


def print_match_table(placement: dict[str, Any]) -> None:
    """The match table as ChainOpera Launch prints it, then why the other nodes do not fit."""
    con = render.console()
    if placement["pinned_region"]:
        con.print(
            f"Runs only in region {placement['pinned_region']} ({placement['pinned_by'] or 'region:'})."
        )
    if placement["matches"]:
        con.print("Searched and matched the following GPU resource for your job:")
        t = Table(header_style="bold")
        for header in MATCH_HEADERS:
            t.add_column(header, no_wrap=True)
        for row in placement["matches"]:
            t.add_row(*MatchRow(**row).cells())
        con.print(t)
        chosen = next((row for row in placement["matches"] if row.get("selected")), None)
        if chosen is not None and chosen.get("provider") == "gcp":
            # cost before money: say that choosing this row rents a VM (docs/gcp.md "Burst compute for jobs")
            con.print(
                f"The job would get a new GCP VM ({chosen['instance']}) in {chosen['region']}, billed by "
                "Google while it exists and deleted when the job ends; the cost per hour above is Google's "
                "GPU price plus rigbase's usage fee.",
                soft_wrap=True,
            )
        for region, age in (placement.get("gcp_quota_age_s") or {}).items():
            when = "never read yet" if age is None else f"read {render.human_duration(age)} ago"
            con.print(f"GCP capacity in {region} is from its quota {when} (refreshed every 60 s).")
    else:
        con.print("No resource fits the job now.")
    _print_workers(con, placement.get("workers") or [])
    if placement["rejected"]:
        con.print(f"Not matched ({placement['rejected_total']}):")
        for r in placement["rejected"]:
            con.print(f"  {r['node']} ({r['region']}): {r['message']}", soft_wrap=True)
    _print_price(con, placement)


def _print_workers(con: Any, workers: list[dict[str, Any]]) -> None:
    """Where each worker of a job of several would run now."""
    if len(workers) < 2:
        return
    con.print("Workers:")
    for w in workers:
        where = f"{w['node']} ({w['region']})" if w.get("node") else "waits"
        con.print(f"  {w['index']} {w['group']}: {where}")


def _print_price(con: Any, placement: dict[str, Any]) -> None:
    """The price the job would pay: fixed when it is placed, by the rules of the region it lands in."""
    if placement.get("price_per_gpu_hour") is not None:
        con.print(f"Placed now, the job pays {placement['price_per_gpu_hour']} credits per GPU-hour.")
    if placement["waiting_reason"]:
        con.print(f"The job would wait: {placement['waiting_reason']}", soft_wrap=True)
        con.print("A waiting job pays the price of the region it is placed in, when it is.")


def _ask(question: str) -> bool:
    """[y/N] on a terminal; otherwise one answer line from stdin (none: refused, pass --yes)."""
    if sys.stdin.isatty():
        return typer.confirm(question, default=False, err=True)
    print(f"{question} [y/N]: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer:
        fail(f"{question} needs an answer: pass --yes", exit_code=EXIT_USAGE)
    return answer.strip().lower() in ("y", "yes")


@app.command("create")
def create(
    file: SpecFile,
    project: ProjectOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show where the job would run and why; create nothing.")
    ] = False,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Create a job from a spec file; prints its id. Asks first, showing the match table, unless --yes."""
    parsed = _read_spec(file)
    for note in parsed.notes:  # what the conversion changed or dropped, before anything runs
        print(f"warning: {note}", file=sys.stderr)
    client = connect()
    spec = parsed.spec
    source = spec.model.source if spec.model is not None else None
    if source is not None:
        if dry_run:  # nothing is uploaded for a dry run: where it runs does not depend on the code
            print(
                f"warning: model.source {source!r} is made into a model when the job is created",
                file=sys.stderr,
            )
            spec = spec.model_copy(update={"model": None})
        else:
            from provisioner.cli.job_code import model_for

            named = model_for(client, source, file.resolve().parent, project)
            spec = spec.model_copy(update={"model": ModelRef(name=named)})
    body = {"spec": spec.model_dump(mode="json"), "project": project}
    if dry_run or not yes:
        placement = client.post("/v1/jobs/dry-run", body)
        for warning in placement.get("warnings") or []:  # what would fail or wait at start
            print(f"warning: {warning}", file=sys.stderr)
        if dry_run:
            if not render.machine(placement, render.chosen(json_out)):
                print_match_table(placement)
            return
        print_match_table(placement)
        question = (
            "Do you want to launch the job with the above matched GPU resource?"
            if placement["fits"]
            else "Create the job anyway? It waits until a resource fits"
        )
        if not _ask(question):
            fail("nothing created: answer y, or pass --yes")
    job = client.post("/v1/jobs", body)
    # a waiting job's reason already says it waits ("Waiting for GPUs: …")
    on = nodes_of(job)
    said = f"{job['state']} on {on}" if on != "-" else f"{job['state']}: {job['reason']}"
    print(f"job {job['name']} {said}", file=sys.stderr)
    render.created(job, as_json=json_out)


def nodes_of(job: dict[str, Any]) -> str:
    """Every node the job's workers are on, in worker order (the API's `node` is worker 0's)."""
    names = dict.fromkeys(w["node"] for w in job.get("workers") or [] if w.get("node"))
    return ", ".join(names) or job.get("node") or "-"


@app.command("convert")
def convert(file: SpecFile, json_out: Json = False) -> None:
    """Print the rigbase spec a file becomes (what the conversion changed as comments)."""
    text = read_input(file, "a job spec file", called="spec file")
    try:
        print(job_formats.convert(text, None if str(file) == "-" else file.name, as_json=json_out), end="")
    except SpecError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None


@app.command("list")
@output_options
def list_(
    project: ProjectOpt = None,
    state: Annotated[str | None, typer.Option("--state", help="Only jobs in this state.")] = None,
    json_out: Json = False,
) -> None:
    """List your account's jobs, newest first."""
    rows = connect().get("/v1/jobs", project=project, state=state)["items"]
    render.table(
        rows, COLUMNS, wide=WIDE, as_json=json_out, empty="no job yet: `provision job create -f FILE`"
    )


@app.command("show")
@output_options
def show(name: Name, json_out: Json = False) -> None:
    """Show one job and its workers (node, state, exit code)."""
    if render.is_machine(json_out):
        show_one(f"/v1/jobs/{name}", as_json=json_out)
        return
    client = connect()
    job = client.get(f"/v1/jobs/{name}")
    job["node"] = nodes_of(job)
    if job.get("url_path"):  # a notebook's or endpoint's URL (provision job url)
        job["url"] = client.url + job["url_path"]
    render.detail(job, fields=None if render.chosen() is render.Output.WIDE else SHOW_FIELDS)
    print()
    render.table(job["workers"], WORKER_COLUMNS)
    left = client.get(f"/v1/jobs/{job['id']}/outputs")["items"]
    if left:  # what the workers left in /opt/ml/output, and whether it reached the spec's destination
        print("\nOutputs (provision job output " + job["name"] + " --download DIR):")
        render.table(left, OUTPUT_COLUMNS)


@app.command("url")
@output_options
def url(name: Name, json_out: Json = False) -> None:
    """A notebook's or endpoint's URL, whether it answers yet (and why not), and a notebook's token (for
    its LAN address: through the URL you are signed in already)."""
    shown = connect().get(f"/v1/jobs/{name}/url")
    if render.is_machine(json_out):
        render.detail(shown, as_json=json_out)
        return
    print(shown["url"])
    if not shown["ready"]:
        print(f"not serving yet: {shown['reason']}", file=sys.stderr)
    if shown.get("token"):
        print(f"token: {shown['token']}", file=sys.stderr)


@app.command("connect")
def connect_port(
    name: Name,
    port: Annotated[
        str,
        typer.Option(
            "--port",
            "-p",
            help="LOCAL[:REMOTE]: forward 127.0.0.1:LOCAL to the worker's REMOTE (default: LOCAL).",
        ),
    ],
) -> None:
    """Forward a local port to a port of the job's worker 0 through its node's tunnel, as
    `kubectl port-forward` does (TensorBoard, a debugger, a database); Ctrl-C stops it."""
    import socket

    from provisioner.client.http import client_context
    from provisioner.client.job_connect import Forward, serve

    local_text, _, remote_text = port.partition(":")
    if not (local_text.isdigit() and (remote_text or local_text).isdigit()):
        fail(f"--port {port!r} is not LOCAL[:REMOTE]: give port numbers, e.g. --port 6006 or 8080:6006")
    local, remote = int(local_text), int(remote_text or local_text)
    if not (0 < local < 65536 and 0 < remote < 65536):
        fail(f"--port {port!r}: ports are 1-65535")
    client = connect()
    job = client.get(f"/v1/jobs/{name}")
    context = client_context(client.ca)
    forward = Forward(
        client.url,
        client.token or "",
        context if isinstance(context, ssl.SSLContext) else None,
        job["id"],
        remote,
    )
    try:
        listener = socket.create_server(("127.0.0.1", local))
    except OSError as exc:
        fail(f"cannot listen on 127.0.0.1:{local} ({exc.strerror}): choose another local port")
    print(
        f"forwarding 127.0.0.1:{local} to port {remote} of job {job['name']} ({job['id']}); Ctrl-C stops",
        flush=True,
    )
    try:
        serve(forward, listener, lambda note: print(note, file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()


@app.command("history")
@output_options
def history(name: Name, json_out: Json = False) -> None:
    """Every transition of the job and of its workers, oldest first."""
    render.table(connect().get(f"/v1/jobs/{name}/history")["items"], HISTORY_COLUMNS, as_json=json_out)


@app.command("stop")
def stop(name: Name, json_out: Json = False) -> None:
    """Stop a job: its workers get SIGTERM, a grace period, then SIGKILL."""
    job = connect().post(f"/v1/jobs/{name}/stop", {})
    render.detail(job, as_json=json_out, fields=None if json_out else ["id", "name", "state", "reason"])


@app.command("logs")
def logs(
    name: Name,
    worker: Annotated[
        int | None, typer.Option("--worker", "-w", min=0, help="Only this worker (default: every worker).")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="Print the output as the node sent it, escape sequences included."),
    ] = False,
) -> None:
    """A job's output (stdout and stderr of each worker, in order); --follow waits for more until the end.
    Control characters the node sent (escape sequences that could rewrite the terminal) are shown as
    visible text, e.g. \\x1b, unless --raw is given; tabs, line breaks and carriage returns stay."""
    client = connect()
    job = client.get(f"/v1/jobs/{name}")
    workers = [worker] if worker is not None else [w["index"] for w in job["workers"]]
    if worker is not None and worker >= len(job["workers"]):
        fail(
            f"job '{job['name']}' has workers 0-{len(job['workers']) - 1}: pass one of them to --worker",
            exit_code=EXIT_USAGE,
        )
    prefix = len(workers) > 1
    offsets = dict.fromkeys(workers, 0)
    done: set[int] = set()
    notices: dict[int, str] = {}
    while True:
        for index in workers:
            if index in done:
                continue
            page = client.get(f"/v1/jobs/{job['id']}/logs", worker=index, offset=offsets[index])
            _print_log(page["data"], f"[worker {index}] " if prefix else "", raw=raw)
            offsets[index] = page["next_offset"]
            if page.get("metrics_notice"):
                notices[index] = page["metrics_notice"]
            if page["complete"] or (not follow and page["next_offset"] == page["offset"]):
                done.add(index)
        if len(done) == len(workers):
            for notice in notices.values():  # once, after the output: the log itself is as the job wrote it
                print(f"rigbase: {notice}", file=sys.stderr)
            return
        if follow:
            time.sleep(FOLLOW_EVERY_S)


# C0 and C1 control characters but tab, line feed and carriage return (progress bars redraw a line with
# it): ESC starts every terminal escape sequence
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def visible(data: str) -> str:
    """Control characters as text (`\\x1b`), so a log cannot move the cursor, retitle or recolour."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", data)


def _print_log(data: str, prefix: str, *, raw: bool = False) -> None:
    if not data:
        return
    if not raw:
        data = visible(data)
    if prefix:
        data = "".join(prefix + line for line in data.splitlines(keepends=True))
    sys.stdout.write(data)
    sys.stdout.flush()


class MetricsOutput(StrEnum):
    TABLE = "table"
    JSON = "json"  # an array; with --follow one object per line as the points come
    CSV = "csv"


METRIC_FIELDS = ("worker", "step", "name", "value", "at")


def _print_points(points: list[dict[str, Any]], output: MetricsOutput, *, header: bool) -> None:
    rows = [{k: p[k] for k in METRIC_FIELDS} for p in points]
    if output is MetricsOutput.CSV:
        writer = csv.DictWriter(sys.stdout, fieldnames=METRIC_FIELDS, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
    elif output is MetricsOutput.JSON:
        for row in rows:
            print(json.dumps(row))
    else:
        if header:
            print(f"{'WORKER':<7} {'STEP':>8}  {'NAME':<24} {'VALUE':>14}  AT")
        for r in rows:
            step = "-" if r["step"] is None else str(r["step"])
            at = render.local_time(r["at"])
            print(f"{r['worker']:<7} {step:>8}  {r['name']:<24} {r['value']:>14.6g}  {at}")
    sys.stdout.flush()


def _notices(page: dict[str, Any], said: dict[int, str]) -> None:
    """A worker's notice on stderr (refused lines, dropped points) whenever it changes."""
    for w in page["workers"]:
        if w["notice"] and said.get(w["worker"]) != w["notice"]:
            said[w["worker"]] = w["notice"]
            print(w["notice"], file=sys.stderr)


@app.command("metrics")
def metrics(
    name: Name,
    worker: Annotated[int | None, typer.Option("--worker", min=0, help="Only this worker.")] = None,
    metric: Annotated[
        list[str] | None, typer.Option("--name", "-n", help="Only this metric (repeatable).")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    output: Annotated[
        MetricsOutput, typer.Option("--output", "-o", help="table, json or csv.", case_sensitive=False)
    ] = MetricsOutput.TABLE,
    json_out: Json = False,
) -> None:
    """The metrics a job's workers printed (`rigbase:metric {"step": 1, "loss": 0.5}` lines), in the
    order they came; --follow waits for more until the job ends (docs/job-metrics.md)."""
    output = MetricsOutput.JSON if json_out else output
    client = connect()
    after, first = 0, True
    said: dict[int, str] = {}
    collected: list[dict[str, Any]] = []
    while True:
        page = client.get(f"/v1/jobs/{name}/metrics", after=after, worker=worker, name=metric or None)
        _notices(page, said)
        if output is MetricsOutput.JSON and not follow:
            collected.extend(page["points"])
        elif page["points"] or (first and output is not MetricsOutput.JSON):
            _print_points(page["points"], output, header=first)
            first = False
        more = page["next_after"] != after
        after = page["next_after"]
        if more:
            continue
        if page["complete"] or not follow:
            break
        time.sleep(FOLLOW_EVERY_S)
    if output is MetricsOutput.JSON and not follow:
        print(json.dumps([{k: p[k] for k in METRIC_FIELDS} for p in collected], indent=2))


def _gpu_cells(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    return ", ".join(
        f"{g['index']}: {g['util_pct']:.0f}% {render.human_bytes(g['memory_bytes'])} {g['power_w']:.0f}W "
        f"{g['temp_c']:.0f}C"
        for g in gpus
    )


@app.command("usage")
@output_options
def usage(
    name: Name,
    worker: Annotated[int | None, typer.Option("--worker", min=0, help="Only this worker.")] = None,
    json_out: Json = False,
) -> None:
    """What each worker's container uses now: CPU cores, memory, disk against its quota, network, GPUs
    (sampled by its node about every 10 s). -o json gives every sample kept (docs/job-metrics.md)."""
    page = connect().get(f"/v1/jobs/{name}/usage", worker=worker)
    if render.machine(page, render.chosen(json_out)):
        return
    latest: dict[int, dict[str, Any]] = {}
    for sample in page["samples"]:
        latest[sample["worker"]] = sample
    quota = f" of {page['disk_gb']}GiB" if page["disk_gb"] else ""
    rows = [
        {
            "worker": s["worker"],
            "cpu": f"{s['cpu_cores']:.2f}",
            "memory": render.human_bytes(s["memory_bytes"]),
            "disk": render.human_bytes(s["disk_bytes"]) + quota,
            "net": f"{render.human_bytes(s['net_rx_bytes'])} / {render.human_bytes(s['net_tx_bytes'])}",
            "gpus": _gpu_cells(s["gpus"]),
            "at": render.local_time(datetime.fromtimestamp(s["at"], UTC).isoformat()),
        }
        for s in sorted(latest.values(), key=lambda s: s["worker"])
    ]
    render.table(
        rows,
        USAGE_COLUMNS,
        empty="no usage sampled yet: a running worker's node sends a sample about every 10 s",
    )


USAGE_COLUMNS: render.Columns = [
    ("worker", "WORKER"),
    ("cpu", "CPU CORES"),
    ("memory", "MEMORY"),
    ("disk", "DISK"),
    ("net", "NET IN / OUT"),
    ("gpus", "GPUS (UTIL MEM POWER TEMP)"),
    ("at", "SAMPLED"),
]


OUTPUT_COLUMNS: list[render.Column] = [
    ("worker", "WORKER"),
    ("state", "STATE"),
    ("file_count", "FILES"),
    ("size_bytes", "SIZE", lambda r: render.human_bytes(r["size_bytes"])),
    ("destination", "DESTINATION", lambda r: r["destination"] or "kept here"),
    ("reason", "REASON", lambda r: r["reason"] or ""),
]


@app.command("output")
@output_options
def output(
    name: Name,
    worker: Annotated[int | None, typer.Option("--worker", "-w", min=0, help="Only this worker.")] = None,
    download: Annotated[
        Path | None,
        typer.Option("--download", "-d", help="Write the files here (several workers: DIR/worker-N)."),
    ] = None,
    json_out: Json = False,
) -> None:
    """What the job's workers left in /opt/ml/output, and where it was delivered; --download fetches it,
    every chunk checked against its SHA-256."""
    from provisioner.client.object_download import download_output

    client = connect()
    rows = [r for r in client.get(f"/v1/jobs/{name}/outputs")["items"] if worker in (None, r["worker"])]
    if download is None:
        render.table(rows, OUTPUT_COLUMNS, as_json=json_out, empty=f"job '{name}' has left no output yet")
        return
    if not rows:
        fail(f"job '{name}' has left no output yet{'' if worker is None else f' for worker {worker}'}")
    several = len(rows) > 1 or worker is None and len(client.get(f"/v1/jobs/{name}")["workers"]) > 1
    for row in rows:
        where = download / f"worker-{row['worker']}" if several else download
        files, size = download_output(client, name, row["worker"], where)
        print(
            f"worker {row['worker']}: {files} file(s), {render.human_bytes(size)} in {where}", file=sys.stderr
        )
