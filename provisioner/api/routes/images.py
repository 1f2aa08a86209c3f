"""Operator routes of image manifests: trusted image-builder keys and signed manifests per region
(provisioner/services/images.py). Binary inputs travel as base64 so the signed bytes arrive exact."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from contracts.errors import InvalidInput
from provisioner.api.deps import Db, Operator
from provisioner.api.schemas import Page
from provisioner.domain.states import ImageState, TrustState
from provisioner.services import images
from provisioner.store.image_models import ImageKey, RegisteredManifest

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
    manifest: dict[str, Any] | None = None  # only in `show`

    @classmethod
    def of(cls, row: RegisteredManifest, full: bool = False) -> ManifestOut:
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
            manifest=images.manifest_document(row) if full else None,
        )


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{what} is not base64: send the file's bytes base64-encoded") from None


@router.post("/v1/image-keys", status_code=201)
def trust_key(body: KeyIn, session: Db, actor: Operator) -> KeyOut:
    # PEM or base64 text as sent: the service (image_builder.manifest) reads both and words the refusal
    return KeyOut.of(images.trust_key(session, body.public_key.encode(), name=body.name, actor=actor))


@router.get("/v1/image-keys")
def list_keys(session: Db) -> Page[KeyOut]:
    return Page(items=[KeyOut.of(k) for k in images.list_keys(session)])


@router.delete("/v1/image-keys/{ref}")
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
    return Page(items=[ManifestOut.of(m) for m in images.list_manifests(session, region)])


@router.get("/v1/images/{ref}")
def show(ref: str, session: Db) -> ManifestOut:
    return ManifestOut.of(images.get_manifest(session, ref), full=True)


@router.delete("/v1/images/{ref}")
def remove(ref: str, session: Db, actor: Operator) -> ManifestOut:
    out = ManifestOut.of(images.remove(session, ref, actor=actor))
    out.state = ImageState.REMOVED.value
    return out
