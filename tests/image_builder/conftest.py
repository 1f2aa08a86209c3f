"""Session fixtures for the image suite: one source snapshot, one cache, two builds (USB and GCE targets), a
manufactured swtpm.

The cache defaults to $RIGBASE_HOME/cache/image-builder (shared with `make bench`, keyed by inputs); set
RIGBASE_IMAGE_TEST_CACHE to use another. The source is snapshotted once so that engineers editing the tree
during the run cannot make the two builds differ."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from image_builder import build, manifest, wheel
from image_builder.plan import BuildConfig
from image_builder.settings import BuilderSettings

REPO = Path(__file__).resolve().parents[2]
EPOCH = 1700000000
BUNDLE = {
    "version": 1,
    "control_plane_url": "http://cp.rigbase.test:8470",
    "ca_certificate": None,
    "region": "lab",
    "region_id": "rg-imagetest",
    "provider": "physical",
    "join_token": "test-join-token",
    "expires_at": None,
}


@dataclass(frozen=True)
class Built:
    out: Path
    again: Path
    manifest: dict
    key_pub: Path
    cache: Path
    timings: dict


def _cache_dir() -> Path:
    if os.environ.get("RIGBASE_IMAGE_TEST_CACHE"):
        return Path(os.environ["RIGBASE_IMAGE_TEST_CACHE"])
    return BuilderSettings.from_env().cache_dir()


@pytest.fixture(scope="session")
def source_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    snap = tmp_path_factory.mktemp("rigbase-src")
    for f in wheel.source_files(REPO):
        (snap / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, snap / f)
    subprocess.run(["git", "init", "-q", str(snap)], check=True)
    subprocess.run(["git", "-C", str(snap), "add", "-A"], check=True)
    return snap


@pytest.fixture(scope="session")
def built_image(tmp_path_factory: pytest.TempPathFactory, source_snapshot: Path) -> Built:
    d = tmp_path_factory.mktemp("image")
    priv, pub = manifest.keygen(d / "builder.pem")
    bundle = d / "bundle.json"
    bundle.write_text(json.dumps(BUNDLE))
    cache = _cache_dir()
    outs, docs = [], []
    for name in ("out", "again"):
        cfg = BuildConfig(
            bundle=bundle,
            output=d / name,
            cache=cache,
            key=priv,
            source_date_epoch=EPOCH,
            repo=source_snapshot,
            targets=("usb", "gce"),
        )
        docs.append(build.build(cfg, log=lambda m: None))
        outs.append(d / name)
    return Built(
        outs[0],
        outs[1],
        json.loads((outs[0] / "manifest.json").read_bytes()),
        pub,
        cache,
        docs[1]["_timings"],
    )


@pytest.fixture(scope="session")
def lab_tpm(tmp_path_factory: pytest.TempPathFactory):
    """A swtpm state with an RSA EK certificate from a private vendor CA (the lab's own helper)."""
    from provisioner.lab.swtpm import create_vendor_ca, provision_swtpm

    d = tmp_path_factory.mktemp("image-tpm")
    return provision_swtpm(d / "tpm", create_vendor_ca(d / "ca"))
