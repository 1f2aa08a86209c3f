"""`provision image publish --provider gcp` at the service level: the
real store, the real google-cloud-storage client against gcp-storage-emulator, the client side of the
resumable upload protocol, and images.insert on the Compute fake, whose import reads the uploaded archive
back from the emulator. The CLI end to end is in test_control_plane.py's walkthrough."""

from __future__ import annotations

import base64
import hashlib
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import InvalidInput, RuleViolation
from provisioner.client.errors import ControlPlaneError
from provisioner.client.resumable_upload import QUANTUM, crc32c_and_sha256, upload
from provisioner.domain.states import PublicationState
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.cloud import image_publish
from provisioner.services.fleet import images
from provisioner.services.regions import providers as provider_service
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.image_models import ImagePublication
from tests.fixtures.gcp import PROJECT
from tests.fixtures.manifests import Builder, gce_build
from tests.provisioner.gcp.test_reconcilers import create, enabled_gcp

ACTOR = "operator:test"


@pytest.fixture()
def store(tmp_path: Path, fake_compute: Any, storage_emulator: str) -> Iterator[sessionmaker[Session]]:
    fake_compute.fake.storage_url = storage_emulator
    engine, sessions = enabled_gcp(
        f"sqlite:///{tmp_path / 'rigbase.db'}", tmp_path, fake_compute, storage=storage_emulator
    )
    create(sessions, published=False)
    yield sessions
    engine.dispose()


def registered(sessions: sessionmaker[Session], manifest: Path) -> str:
    builder_pub = manifest.parent.parent / "image-builder" / "signing-key.pub"
    with session_scope(sessions) as s:
        if not images.list_keys(s):
            images.trust_key(s, builder_pub.read_bytes(), name="builder", actor=ACTOR)
        sig = manifest.with_name("manifest.json.sig").read_bytes()
        return images.register(s, manifest.read_bytes(), sig, actor=ACTOR).id


def start(sessions: sessionmaker[Session], image_id: str, crc32c: str, **kw: Any) -> tuple[str, str | None]:
    with session_scope(sessions) as s:
        pub, url = image_publish.start(s, image_id, provider="gcp", crc32c=crc32c, actor=ACTOR, **kw)
        return pub.id, url


def imported(sessions: sessionmaker[Session], pub_id: str) -> tuple[str, str | None]:
    """gcp-regions passes until the import has an outcome (the fake's operation takes 50 ms)."""
    deadline = time.monotonic() + 10
    while True:
        ReconcilerLoop(sessions, only=["gcp-regions"]).run_once()
        state = state_of(sessions, pub_id)
        if state[0] != PublicationState.IMPORTING or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def state_of(sessions: sessionmaker[Session], pub_id: str) -> tuple[str, str | None]:
    with session_scope(sessions) as s:
        pub = s.get_one(ImagePublication, pub_id)
        return pub.state, pub.reason


def test_publish_resumes_an_interrupted_upload_imports_once_and_the_region_boots_its_family(
    store: sessionmaker[Session], fake_compute: Any, tmp_path: Path, gce_archive: Path
) -> None:
    manifest = gce_build(Builder(tmp_path / "image-builder"), tmp_path / "build", "us-central1", gce_archive)
    archive = manifest.with_name("rigbase-gce.tar.gz")
    image_id = registered(store, manifest)
    crc32c, sha = crc32c_and_sha256(archive)
    assert sha == hashlib.sha256(archive.read_bytes()).hexdigest()
    pub_id, url = start(store, image_id, crc32c)
    assert url is not None and state_of(store, pub_id)[0] == PublicationState.UPLOADING

    # the connection breaks after two chunks: publishing again hands back the same session, which
    # resumes after the bytes Cloud Storage kept
    class Broken(Exception):
        pass

    def break_after_two(done: int, _total: int) -> None:
        if done >= 2 * QUANTUM:
            raise Broken

    with pytest.raises(Broken):
        upload(url, archive, chunk_size=QUANTUM, on_progress=break_after_two)
    assert start(store, image_id, crc32c) == (pub_id, url)
    with session_scope(store) as s:
        with pytest.raises(Exception, match="not complete"):
            image_publish.complete(s, pub_id, actor=ACTOR)
    sent = upload(url, archive, chunk_size=QUANTUM)
    assert sent == archive.stat().st_size - 2 * QUANTUM

    with session_scope(store) as s:
        pub = image_publish.complete(s, pub_id, actor=ACTOR)
        name, family = pub.image_name, pub.family
    assert state_of(store, pub_id)[0] in (PublicationState.IMPORTING, PublicationState.PUBLISHED)
    image = fake_compute.fake.images[name]
    assert image["family"] == family == "rigbase-us-central1"
    assert image["guestOsFeatures"] == [{"type": "UEFI_COMPATIBLE"}]
    assert image["labels"]["rigbase-managed"] == "rigbase" and image["labels"]["rigbase-role"] == "image"
    assert image["rawDisk"]["source"] == (
        f"https://storage.googleapis.com/rigbase-images-{PROJECT}/images/"
        f"{hashlib.sha256(manifest.read_bytes()).hexdigest()}/rigbase-gce.tar.gz"
    )
    # the gcp-regions pass reads the import's outcome, then starts the storage node on the family
    assert imported(store, pub_id) == (PublicationState.PUBLISHED, None)
    ReconcilerLoop(store, only=["gcp-regions"]).run_once()
    assert fake_compute.fake.images[name]["status"] == "READY"
    with session_scope(store) as s:
        region = region_service.get(s, "us-central1")
        assert image_publish.source_image(s, region) == f"projects/{PROJECT}/global/images/family/{family}"
    (inst,) = fake_compute.fake.instances.values()
    boot = next(d for d in inst["disks"] if d.get("boot"))
    assert boot["initializeParams"]["sourceImage"].endswith(f"/images/family/{family}")

    # publishing again does nothing: no upload, no second import
    assert start(store, image_id, crc32c) == (pub_id, None)
    with session_scope(store) as s:
        image_publish.complete(s, pub_id, actor=ACTOR)
    assert fake_compute.fake.calls["image_insert"] == 1


def test_bytes_that_do_not_match_the_declared_crc32c_are_refused_and_a_new_session_takes_the_right_ones(
    store: sessionmaker[Session], tmp_path: Path, gce_archive: Path
) -> None:
    manifest = gce_build(Builder(tmp_path / "image-builder"), tmp_path / "build", "us-central1", gce_archive)
    archive = manifest.with_name("rigbase-gce.tar.gz")
    image_id = registered(store, manifest)
    crc32c, _ = crc32c_and_sha256(archive)
    pub_id, url = start(store, image_id, crc32c)
    assert url is not None
    corrupt = tmp_path / "corrupt.tar.gz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ControlPlaneError, match="HTTP 400.*CRC32C") as refused:
        upload(url, corrupt)
    assert refused.value.status == 400
    _, again = start(store, image_id, crc32c, restart=True)
    assert again is not None and again != url
    upload(again, archive)
    with session_scope(store) as s:
        assert image_publish.complete(s, pub_id, actor=ACTOR).state != PublicationState.FAILED


def test_an_archive_compute_cannot_import_fails_with_the_reason_and_can_be_published_again(
    store: sessionmaker[Session], fake_compute: Any, tmp_path: Path, gce_archive: Path
) -> None:
    # a tar.gz holding something other than disk.raw: the signed manifest describes it, the import refuses
    other = tmp_path / "other"
    other.mkdir()
    (other / "rootfs.img").write_bytes(b"\0" * 4096)
    wrong = tmp_path / "wrong.tar.gz"
    with tarfile.open(wrong, "w:gz") as tar:
        tar.add(other / "rootfs.img", arcname="rootfs.img")
    manifest = gce_build(Builder(tmp_path / "image-builder"), tmp_path / "build", "us-central1", wrong)
    image_id = registered(store, manifest)
    crc32c, _ = crc32c_and_sha256(manifest.with_name("rigbase-gce.tar.gz"))
    pub_id, url = start(store, image_id, crc32c)
    assert url is not None
    upload(url, manifest.with_name("rigbase-gce.tar.gz"))
    with session_scope(store) as s:
        image_publish.complete(s, pub_id, actor=ACTOR)
    state, reason = imported(store, pub_id)
    assert state == PublicationState.FAILED and "could not import" in (reason or "")
    assert fake_compute.fake.instance_count() == 0  # the storage node still waits for an image
    # publishing again (say Compute failed for a reason of its own): the failed image is deleted and the
    # object, already complete, is imported again under a new requestId
    name = next(iter(fake_compute.fake.images))
    assert start(store, image_id, crc32c) == (pub_id, None)
    assert name not in fake_compute.fake.images and state_of(store, pub_id)[0] == PublicationState.UPLOADING
    with session_scope(store) as s:
        image_publish.complete(s, pub_id, actor=ACTOR)
    assert fake_compute.fake.calls["image_insert"] == 2 and name in fake_compute.fake.images
    assert imported(store, pub_id)[0] == PublicationState.FAILED  # the same archive fails the same way


def test_refusals_name_what_to_do_and_store_nothing(
    store: sessionmaker[Session], tmp_path: Path, gce_archive: Path
) -> None:
    builder = Builder(tmp_path / "image-builder")
    usb_only = builder.write(tmp_path / "usb-only", builder.manifest(region="us-central1"))
    gce = gce_build(builder, tmp_path / "build", "us-central1", gce_archive)
    with session_scope(store) as s:
        images.trust_key(s, builder.public, name="builder", actor=ACTOR)
        usb_id = images.register(
            s, usb_only.read_bytes(), usb_only.with_name("manifest.json.sig").read_bytes(), actor=ACTOR
        ).id
        gce_id = images.register(
            s, gce.read_bytes(), gce.with_name("manifest.json.sig").read_bytes(), actor=ACTOR
        ).id
        provider_service.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "lab", provider="physical", actor=ACTOR)
    physical = builder.write(tmp_path / "physical", builder.manifest(region="lab"))
    with session_scope(store) as s:
        lab_id = images.register(
            s, physical.read_bytes(), physical.with_name("manifest.json.sig").read_bytes(), actor=ACTOR
        ).id
    good_crc = base64.b64encode(b"\0\0\0\1").decode()
    cases: list[tuple[str, str, str, type[Exception], str]] = [
        (
            usb_id,
            "gcp",
            good_crc,
            RuleViolation,
            "has no GCE target: build it with `image-builder build --target gce",
        ),
        (lab_id, "gcp", good_crc, RuleViolation, "not a GCP region"),
        (gce_id, "aws", good_crc, InvalidInput, "published to gcp only"),
        (gce_id, "gcp", "not-base64!", InvalidInput, "crc32c must be the base64"),
        (gce_id, "gcp", base64.b64encode(b"12345").decode(), InvalidInput, "4-byte CRC32C"),
    ]
    for image_id, provider, crc32c, error, words in cases:
        with session_scope(store) as s, pytest.raises(error, match=words.replace("(", r"\(")):
            image_publish.start(s, image_id, provider=provider, crc32c=crc32c, actor=ACTOR)
    with session_scope(store) as s:
        assert s.scalar(select(func.count()).select_from(ImagePublication)) == 0
