"""Operator routes of image manifests: trusted image-builder keys and signed manifests per region
(provisioner/services/fleet/images.py). Binary inputs travel as base64 so the signed bytes arrive exact."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from contracts.errors import InvalidInput
from provisioner.api.deps import Db, Operator, TrustRoot
from provisioner.api.schemas import Page
from provisioner.domain.states import ImageState, TrustState
from provisioner.services.cloud import image_publish
from provisioner.services.fleet import images
from provisioner.store.image_models import ImageKey, ImagePublication, RegisteredManifest

router = APIRouter(tags=["images"])


class KeyIn(BaseModel):
    public_key: str  # PEM, or base64 of the raw 32 bytes
    name: str | None = None


class KeyOut(BaseModel):
    id: str
    name: str
    fingerprint: str
    created_at: datetime
    state: str = TrustState.TRUSTED.value

    @classmethod
    def of(cls, row: ImageKey) -> KeyOut:
        return cls(id=row.id, name=row.name, fingerprint=row.fingerprint, created_at=row.created_at)


class ManifestIn(BaseModel):
    manifest: str  # base64 of the exact manifest.json bytes
    signature: str  # the .sig file's contents (base64 of the 64-byte Ed25519 signature)
    region: str | None = None


class PublishIn(BaseModel):
    provider: str  # gcp
    crc32c: str  # base64 of the archive's CRC32C, as Cloud Storage reports it
    restart: bool = False  # a new upload session: Cloud Storage refused the one under way


class PublicationOut(BaseModel):
    id: str
    image_id: str
    provider: str
    target: str
    state: str
    reason: str | None
    image_name: str
    family: str
    bucket: str
    object_name: str
    size: int
    updated_at: datetime
    # the resumable upload session to send the archive to: only in the answer that opened it
    upload_url: str | None = None

    @classmethod
    def of(cls, row: ImagePublication, upload_url: str | None = None) -> PublicationOut:
        return cls(
            id=row.id,
            image_id=row.manifest_id,
            provider=row.provider.kind,
            target=row.target,
            state=row.state,
            reason=row.reason,
            image_name=row.image_name,
            family=row.family,
            bucket=row.bucket,
            object_name=row.object_name,
            size=row.size,
            updated_at=row.updated_at,
            upload_url=upload_url,
        )

    def summary(self) -> str:
        return f"{self.provider}:{self.image_name} ({self.state})"


class ManifestOut(BaseModel):
    id: str
    region: str
    manifest_sha256: str
    signed_by: str
    key_fingerprint: str
    image_sha256: str
    uki_sha256: str
    verity_root_hash: str
    pcr11: str
    pcr12: str
    pcr4: str | None
    checked_pcrs: list[int]
    packages: int
    created_at: datetime
    state: str = ImageState.REGISTERED.value
    targets: list[str] = []  # what the build made: usb, and gce with --target gce
    published: str = ""  # where it is published, e.g. "gcp:rigbase-lab-0123abcd (published)"
    publications: list[PublicationOut] = []
    manifest: dict[str, Any] | None = None  # only in `show`

    @classmethod
    def of(
        cls, row: RegisteredManifest, full: bool = False, publications: list[ImagePublication] | None = None
    ) -> ManifestOut:
        pubs = [PublicationOut.of(p) for p in publications or []]
        return cls(
            id=row.id,
            region=row.region.name,
            manifest_sha256=row.manifest_sha256,
            signed_by=row.key.name,
            key_fingerprint=row.key.fingerprint,
            image_sha256=row.image_sha256,
            uki_sha256=row.uki_sha256,
            verity_root_hash=row.verity_root_hash,
            pcr11=row.pcr11,
            pcr12=row.pcr12,
            pcr4=row.pcr4,
            checked_pcrs=sorted(images.expected_pcrs(row)),
            packages=row.packages,
            created_at=row.created_at,
            targets=sorted(images.manifest_document(row).get("targets") or {"usb": {}}),
            published=", ".join(p.summary() for p in pubs),
            publications=pubs,
            manifest=images.manifest_document(row) if full else None,
        )


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{what} is not base64: send the file's bytes base64-encoded") from None


@router.post("/v1/image-keys", status_code=201, dependencies=[TrustRoot])
def trust_key(body: KeyIn, session: Db, actor: Operator) -> KeyOut:
    # PEM or base64 text as sent: the service (image_builder.manifest) reads both and words the refusal
    return KeyOut.of(images.trust_key(session, body.public_key.encode(), name=body.name, actor=actor))


@router.get("/v1/image-keys", dependencies=[TrustRoot])
def list_keys(session: Db) -> Page[KeyOut]:
    return Page(items=[KeyOut.of(k) for k in images.list_keys(session)])


@router.delete("/v1/image-keys/{ref}", dependencies=[TrustRoot])
def untrust_key(ref: str, session: Db, actor: Operator, force: bool = False) -> dict[str, Any]:
    key, removed = images.untrust_key(session, ref, force=force, actor=actor)
    out = KeyOut.of(key).model_dump(mode="json")
    return {**out, "state": TrustState.REMOVED.value, "removed_images": [m.id for m in removed]}


@router.post("/v1/images", status_code=201)
def register(body: ManifestIn, session: Db, actor: Operator) -> ManifestOut:
    row = images.register(
        session,
        _b64(body.manifest, "manifest"),
        body.signature.encode(),
        region=body.region,
        actor=actor,
    )
    return ManifestOut.of(row)


@router.get("/v1/images")
def list_images(session: Db, region: str | None = None) -> Page[ManifestOut]:
    rows = images.list_manifests(session, region)
    pubs = image_publish.of_manifests(session, [m.id for m in rows])
    return Page(items=[ManifestOut.of(m, publications=pubs[m.id]) for m in rows])


@router.get("/v1/images/{ref}")
def show(ref: str, session: Db) -> ManifestOut:
    row = images.get_manifest(session, ref)
    return ManifestOut.of(row, full=True, publications=image_publish.of_manifests(session, [row.id])[row.id])


@router.post("/v1/images/{ref}/publications", status_code=201)
def publish(ref: str, body: PublishIn, session: Db, actor: Operator) -> PublicationOut:
    """Start (or resume) publishing the image's GCE target: the answer's upload_url, when set, is the
    resumable upload session to send the archive to; then POST .../complete."""
    pub, url = image_publish.start(
        session, ref, provider=body.provider, crc32c=body.crc32c, actor=actor, restart=body.restart
    )
    return PublicationOut.of(pub, upload_url=url)


@router.post("/v1/images/{ref}/publications/{pub_id}/complete")
def complete_publication(ref: str, pub_id: str, session: Db, actor: Operator) -> PublicationOut:
    """The upload is finished: check the object and import it (images.insert)."""
    image_publish.check_belongs(session, ref, pub_id)
    return PublicationOut.of(image_publish.complete(session, pub_id, actor=actor))


@router.get("/v1/images/{ref}/publications/{pub_id}")
def show_publication(ref: str, pub_id: str, session: Db) -> PublicationOut:
    return PublicationOut.of(image_publish.check_belongs(session, ref, pub_id))


@router.delete("/v1/images/{ref}")
def remove(ref: str, session: Db, actor: Operator) -> ManifestOut:
    out = ManifestOut.of(images.remove(session, ref, actor=actor))
    out.state = ImageState.REMOVED.value
    return out
