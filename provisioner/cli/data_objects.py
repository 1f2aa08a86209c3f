"""`provision dataset|model|checkpoint …`: create from a source (a local path is uploaded), list, show,
remove. The three groups are one set of commands, built per kind (so annotations are evaluated where
they are written: a help text names the kind of its closure)."""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from contracts.data_objects import ObjectKind, SourceScheme, parse_source
from contracts.errors import InvalidInput
from provisioner.cli import render
from provisioner.cli.common import Json, Timeout, Wait, Yes, group, output_options, remove_one
from provisioner.cli.errors import fail
from provisioner.cli.settings import connect
from provisioner.cli.wait import wait_for_state
from provisioner.domain.states import ObjectState

PLURAL = {ObjectKind.DATASET: "datasets", ObjectKind.MODEL: "models", ObjectKind.CHECKPOINT: "checkpoints"}
HELP = {
    ObjectKind.DATASET: "Datasets: data a job reads, mounted read-only at /opt/ml/input.",
    ObjectKind.MODEL: "Models: weights or code a job starts from, mounted read-only at /opt/ml/models.",
    ObjectKind.CHECKPOINT: "Checkpoints: a run's saved state, mounted read-only at /opt/ml/checkpoint.",
}
READY: str = ObjectState.READY.value
COLUMNS: list[render.Column] = [
    ("id", "ID"),
    ("name", "NAME"),
    ("project", "PROJECT"),
    ("state", "STATE"),
    ("size_bytes", "SIZE", lambda r: render.human_bytes(r["size_bytes"]) if r["state"] == READY else "-"),
    ("file_count", "FILES"),
    ("public", "PUBLIC", lambda r: "yes" if r["public"] else ""),
    ("source", "SOURCE"),
    ("created_at", "CREATED"),
]
Project = Annotated[
    str | None, typer.Option("--project", "-p", help="The project (name or OWNER/NAME); else your default.")
]


def _progress_bar() -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    return bar, bar.add_task("uploading", total=None)


def _upload(kind: ObjectKind, name: str, path: Path, project: str | None, public: bool, quiet: bool) -> Any:
    from contracts.object_tree import scan
    from provisioner.client.object_upload import upload

    try:
        tree = scan(path)
    except InvalidInput as exc:
        fail(exc.message)
    client = connect()
    if quiet or not sys.stderr.isatty():
        done = upload(client, PLURAL[kind], name, path, project=project, public=public, tree=tree)
    else:
        bar, task = _progress_bar()
        with bar:

            def show(sent: int, total: int) -> None:
                bar.update(task, completed=sent, total=total)

            done = upload(
                client, PLURAL[kind], name, path, project=project, public=public, progress=show, tree=tree
            )
    held = done.chunks - done.sent
    note = f"resumed: {held} of {done.chunks} chunks were held already; " if done.resumed else ""
    skipped = f"; {done.skipped} link(s) or special file(s) left out" if done.skipped else ""
    print(
        f"{note}sent {done.sent} chunk(s), {render.human_bytes(done.sent_bytes)}{skipped}",
        file=sys.stderr,
    )
    return done.row


def build(kind: ObjectKind) -> typer.Typer:
    app = group(HELP[kind])
    plural = PLURAL[kind]

    @app.command("create")
    def create(
        name: Annotated[str, typer.Argument(help=f"The {kind}'s name, unique in its project.")],
        source: Annotated[
            str,
            typer.Option(
                "--source",
                "-s",
                help="A local file or directory (uploaded, resumable), s3://BUCKET/PREFIX, "
                "gs://BUCKET/PREFIX, https://… (an archive is unpacked) or git+https://HOST/REPO[@REF].",
            ),
        ],
        project: Project = None,
        key: Annotated[
            str | None,
            typer.Option(
                "--key", help="The project key (aws, gcp, azure) that reads the source; else its `default`."
            ),
        ] = None,
        endpoint_url: Annotated[
            str | None,
            typer.Option(
                "--endpoint-url", help="An S3-compatible store's endpoint (MinIO, Ceph), or a blob endpoint."
            ),
        ] = None,
        public: Annotated[
            bool, typer.Option("--public", help="Readable by every account (root admins).")
        ] = False,
        wait: Wait = False,
        timeout: Timeout = 3600.0,
        json_out: Json = False,
    ) -> None:
        """Create it from its source; prints its id. A local path is uploaded now (an interrupted upload
        resumes when the same command runs again); a remote source is read by the control plane: --wait
        waits until it is ready."""
        try:
            parsed = parse_source(source)
        except InvalidInput as exc:
            fail(exc.message)
        if parsed.scheme is SourceScheme.UPLOAD:
            if key or endpoint_url:
                fail("--key and --endpoint-url are for remote sources: a local path is uploaded as it is")
            row = _upload(kind, name, Path(source), project, public, quiet=render.is_machine(json_out))
        else:
            body = {
                "name": name,
                "source": source,
                "project": project,
                "key": key,
                "endpoint_url": endpoint_url,
                "public": public,
            }
            client = connect()
            row = client.post(f"/v1/{plural}", body)
            if wait:
                row = wait_for_state(
                    client,
                    f"/v1/{plural}/{row['id']}",
                    done={READY},
                    failed={ObjectState.FAILED.value},
                    timeout=timeout,
                )
        render.created(row, as_json=json_out)

    @app.command("list")
    @output_options
    def list_(project: Project = None, json_out: Json = False) -> None:
        """Those of the project, and the public ones."""
        render.table(
            connect().get(f"/v1/{plural}", project=project)["items"],
            COLUMNS,
            as_json=json_out,
            empty=f"no {kind} yet: `provision {kind} create NAME --source PATH|URI`",
        )

    @app.command("show")
    @output_options
    def show(
        name: Annotated[str, typer.Argument(help="Its name or id.")],
        project: Project = None,
        files: Annotated[bool, typer.Option("--files", help="List its files.")] = False,
        json_out: Json = False,
    ) -> None:
        """Its state, source, size and digest (--files: every file)."""
        client = connect()
        if files:
            manifest = client.get(f"/v1/{plural}/{name}/manifest", project=project)
            rows = [{"path": f["path"], "size": f["size"], "mode": oct(f["mode"])} for f in manifest["files"]]
            render.table(rows, [("path", "PATH"), ("size", "BYTES"), ("mode", "MODE")], as_json=json_out)
            return
        render.detail(client.get(f"/v1/{plural}/{name}", project=project), as_json=json_out)

    @app.command("remove")
    def remove(
        name: Annotated[str, typer.Argument(help="Its name or id.")],
        project: Project = None,
        yes: Yes = False,
        json_out: Json = False,
    ) -> None:
        """Remove it: refused while a waiting or running job mounts it (the jobs are named)."""
        remove_one(
            f"remove {kind} '{name}'?",
            f"/v1/{plural}/{name}",
            yes=yes,
            as_json=json_out,
            kind=kind.value,
            project=project,
        )

    return app


dataset_app = build(ObjectKind.DATASET)
model_app = build(ObjectKind.MODEL)
checkpoint_app = build(ObjectKind.CHECKPOINT)
