"""Code that travels with a job (docs/data.md, "Code"): a spec's `model.source` (a Launch file's
`workspace`) made into a model of the project before the job is created, and named in the job sent.

A local directory is read next to the spec file, without what its `.gitignore` and Launch's own list
(`__pycache__`, `*.pyc`, `.git`, `*venv`, …) leave out, and uploaded as `code-HEX`, HEX the start of its
digest: the same code again is the same model, uploaded once. A remote source (`git+https://…@REF`,
`s3://…`) becomes `code-HEX` of its URI, read by the control plane once and reused after."""

from __future__ import annotations

import fnmatch
import hashlib
import sys
from pathlib import Path

from contracts.data_objects import SourceScheme, parse_source
from contracts.errors import InvalidInput
from contracts.object_tree import Skip, scan
from provisioner.cli.errors import fail
from provisioner.cli.wait import wait_for_state
from provisioner.client.errors import ControlPlaneError
from provisioner.client.http import Client
from provisioner.client.object_upload import upload
from provisioner.domain.states import ObjectState

# what Launch leaves out of a workspace (FedML's FEDML_MLOPS_BUILD_PRE_IGNORE_LIST), besides .gitignore
LEFT_OUT = (
    "__pycache__",
    "*.pyc",
    ".git",
    "*venv",
    "dist-packages",
    "client-package.zip",
    "server-package.zip",
)
WAIT_S = 1800.0


def ignored(root: Path) -> Skip:
    """The workspace's .gitignore patterns (negations are not read) and LEFT_OUT, as a skip test: a
    pattern without '/' matches any part's name, one with '/' the path from the root."""
    patterns = list(LEFT_OUT)
    rules = root / ".gitignore"
    if rules.is_file():
        for line in rules.read_text(errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")):
                patterns.append(line.rstrip("/"))

    def skip(relative: str) -> bool:
        parts = relative.split("/")
        for pattern in patterns:
            if "/" in pattern.strip("/"):
                if fnmatch.fnmatch(relative, pattern.strip("/")):
                    return True
            elif any(fnmatch.fnmatch(part, pattern.strip("/")) for part in parts):
                return True
        return False

    return skip


def _held(client: Client, name: str, project: str | None) -> str | None:
    try:
        state: str = client.get(f"/v1/models/{name}", project=project)["state"]
    except ControlPlaneError as exc:
        if exc.status == 404:
            return None
        raise
    return state


def model_for(client: Client, source: str, spec_dir: Path, project: str | None) -> str:
    """The model `source` is, made first if the project has none for it; its name."""
    try:
        parsed = parse_source(source)
    except InvalidInput as exc:
        fail(f"model.source: {exc.message}")
    if parsed.scheme is SourceScheme.UPLOAD:
        path = (spec_dir / source).resolve()
        if not path.is_dir():
            fail(f"model.source {source!r}: {path} is not a directory (it is read next to the spec file)")
        tree = scan(path, ignored(path))
        name = "code-" + tree.manifest.digest().removeprefix("sha256:")[:12]
        if _held(client, name, project) != ObjectState.READY:
            sent = upload(client, "models", name, path, project=project, tree=tree).sent
            files = len(tree.manifest.files)
            print(f"model {name}: {files} file(s) of {source} uploaded ({sent} chunk(s))", file=sys.stderr)
        else:
            print(f"model {name}: {source} is already uploaded", file=sys.stderr)
        return name
    name = "code-" + hashlib.sha256(source.encode()).hexdigest()[:12]
    state = _held(client, name, project)
    if state == ObjectState.FAILED:
        fail(f"model {name} from {source} failed: see `provision model show {name}`, remove it and try again")
    if state is None:
        client.post("/v1/models", {"name": name, "source": source, "project": project})
    if state != ObjectState.READY:
        ready = {ObjectState.READY.value}
        wait_for_state(
            client,
            f"/v1/models/{name}",
            done=ready,
            failed={ObjectState.FAILED.value},
            timeout=WAIT_S,
            project=project,
        )
    print(f"model {name}: read from {source}", file=sys.stderr)
    return name
