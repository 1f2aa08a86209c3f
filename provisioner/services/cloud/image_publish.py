"""`provision image publish MANIFEST --provider gcp`: a registered manifest's GCE target made into an image
in the provider's project, in its region's family (docs/gcp.md "The rigbase image on GCE").

Three steps, each resumable:
1. `start`: the manifest must be registered for a GCP region and carry a `gce` target; the bucket is made
   on first use and, unless the object is already there with the declared size and CRC32C, a resumable
   upload session is opened and handed to the CLI (state uploading);
2. the CLI sends the archive's bytes straight to Cloud Storage (the project's key stays here), then calls
   `complete`: the finished object must have the signed manifest's size and the CRC32C the CLI declared,
   and images.insert is sent with a requestId derived from the row (state importing);
3. the gcp-regions reconciler's pass (`refresh`) reads the image's status: READY → published (the
   region's storage node and burst VMs boot `family/<family>` from then on), FAILED → failed.
Publishing again resumes where it stopped; a published image is never imported twice."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from provisioner.domain.states import PUBLICATION_TRANSITIONS, PublicationState
from provisioner.providers.base import Feature, ProvisionFailed, kinds_supporting
from provisioner.providers.gcp import images as gcp_images
from provisioner.providers.gcp import naming
from provisioner.services.cloud import gcp
from provisioner.services.common import lifecycle
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import images as image_service
from provisioner.services.regions import providers as provider_service
from provisioner.store.image_models import ImagePublication, RegisteredManifest
from provisioner.store.models import Provider, Region

KIND = "image_publication"
TARGET = "gce"
REASON_MAX = 500


def _move(session: Session, pub: ImagePublication, to: PublicationState, actor: str, reason: str) -> None:
    lifecycle.apply(
        session,
        pub,
        to,
        kind=KIND,
        name=pub.image_name,
        table=PUBLICATION_TRANSITIONS,
        actor=actor,
        reason=reason[:REASON_MAX],
    )


def _gce_target(row: RegisteredManifest) -> dict[str, Any]:
    target = (image_service.manifest_document(row).get("targets") or {}).get(TARGET)
    if not isinstance(target, dict) or not target.get("file") or not isinstance(target.get("size"), int):
        raise RuleViolation(
            f"image {row.id} has no GCE target: build it with {gcp_images.PUBLISH_HINT}",
            code="image_no_gce_target",
        )
    return target


def _crc32c(value: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 4:
        raise InvalidInput("crc32c must be the base64 of the archive's 4-byte CRC32C (big-endian)")
    return value


def _provider_for(session: Session, row: RegisteredManifest, provider: str) -> Provider:
    publishing = kinds_supporting(Feature.PUBLISHED_IMAGE)
    if provider not in publishing:
        raise InvalidInput(f"--provider {provider}: images are published to {', '.join(publishing)} only")
    prov = gcp.enabled_provider(session)
    if row.region.provider_id != prov.id:
        raise RuleViolation(
            f"image {row.id} is registered for region '{row.region.name}', which is not a GCP region: "
            "publish an image built from a GCP region's bundle (`provision region bundle R`)",
            code="image_not_for_provider",
        )
    return prov


def get(session: Session, pub_id: str) -> ImagePublication:
    pub = session.get(ImagePublication, pub_id)
    if pub is None:
        raise NotFound(
            f"no publication '{pub_id}': run `provision image publish` again", code="publication_not_found"
        )
    return pub


def check_belongs(session: Session, ref: str, pub_id: str) -> ImagePublication:
    """The publication `pub_id` of image `ref` (404 when it is another image's)."""
    row = image_service.get_manifest(session, ref)
    pub = get(session, pub_id)
    if pub.manifest_id != row.id:
        raise NotFound(f"image {row.id} has no publication '{pub_id}'", code="publication_not_found")
    return pub


def start(
    session: Session, ref: str, *, provider: str, crc32c: str, actor: str, restart: bool = False
) -> tuple[ImagePublication, str | None]:
    """The publication (new, or the one to resume) and the upload URL the CLI sends the archive to — None
    when there is nothing to upload (the object is complete, or the image is importing or published).
    An upload under way keeps its session (the CLI resumes it) unless `restart`: a session Cloud Storage
    refused (expired after a week, or the bytes did not match the declared CRC32C) is replaced.
    Refusals store nothing."""
    row = image_service.get_manifest(session, ref)
    prov = _provider_for(session, row, provider)
    target = _gce_target(row)
    crc32c = _crc32c(crc32c)
    pub = session.scalar(
        select(ImagePublication).where(
            ImagePublication.manifest_id == row.id,
            ImagePublication.provider_id == prov.id,
            ImagePublication.target == TARGET,
        )
    )
    if pub is not None and PublicationState(pub.state) in (
        PublicationState.IMPORTING,
        PublicationState.PUBLISHED,
    ):
        return pub, None
    resumable = pub is not None and pub.state == PublicationState.UPLOADING and pub.upload_url
    if resumable and not restart and pub is not None and pub.crc32c == crc32c:
        return pub, pub.upload_url
    config = provider_service.config_of(session, prov)
    prefix = config.public.get("prefix", naming.DEFAULT_PREFIX)
    bucket = gcp_images.bucket_name(config.public["project_id"], prefix)
    obj = gcp_images.object_name(row.manifest_sha256, str(target["file"]))
    ctx = gcp.driver(session).context(config)
    retry = pub is not None and pub.state == PublicationState.FAILED
    try:
        if retry and pub is not None:
            gcp_images.delete_failed(ctx, pub.image_name, prefix)
        gcp_images.ensure_bucket(ctx, bucket)
        have = gcp_images.uploaded(ctx, bucket, obj)
        url = None
        if have != (int(target["size"]), crc32c):
            url = gcp_images.upload_session(ctx, bucket, obj, size=int(target["size"]), crc32c=crc32c)
    except Exception as exc:
        raise Conflict(
            f"Cloud Storage refused the upload to gs://{bucket}: {str(exc).splitlines()[0][:300]}",
            code="image_upload_refused",
        ) from None
    if pub is None:
        pub = ImagePublication(
            manifest_id=row.id,
            provider_id=prov.id,
            target=TARGET,
            state="",
            bucket=bucket,
            object_name=obj,
            size=int(target["size"]),
            crc32c=crc32c,
            image_name=gcp_images.image_name(prefix, row.region.name, row.manifest_sha256),
            family=gcp_images.family(prefix, row.region.name),
            attempt=0,
            created_by=actor[:128],
        )
        session.add(pub)
        session.flush()
    pub.crc32c, pub.upload_url = crc32c, url
    if retry:
        pub.attempt += 1
    if pub.state != PublicationState.UPLOADING:
        _move(session, pub, PublicationState.UPLOADING, actor, f"uploading to gs://{bucket}/{obj}")
    return pub, url


def complete(session: Session, pub_id: str, *, actor: str) -> ImagePublication:
    """Check the uploaded object, then import it (idempotent: past uploading, nothing to do)."""
    pub = get(session, pub_id)
    if PublicationState(pub.state) != PublicationState.UPLOADING:
        return pub
    prov = session.get_one(Provider, pub.provider_id)
    config = provider_service.config_of(session, prov)
    ctx = gcp.driver(session).context(config)
    have = gcp_images.uploaded(ctx, pub.bucket, pub.object_name)
    if have is None:
        raise Conflict(
            f"the upload to gs://{pub.bucket}/{pub.object_name} is not complete: run "
            "`provision image publish` again to resume it",
            code="image_upload_incomplete",
        )
    if have != (pub.size, pub.crc32c):
        _move(
            session,
            pub,
            PublicationState.FAILED,
            actor,
            f"the uploaded object has {have[0]} bytes and CRC32C {have[1]}; the manifest says {pub.size} "
            f"bytes and the archive's CRC32C is {pub.crc32c}: run `provision image publish` again",
        )
        return pub
    row = session.get_one(RegisteredManifest, pub.manifest_id)
    spec = _spec(pub, row, config.public.get("prefix", naming.DEFAULT_PREFIX))
    try:
        status = gcp_images.insert(ctx, spec)
    except ProvisionFailed as exc:
        _move(session, pub, PublicationState.FAILED, actor, exc.message)
        return pub
    pub.upload_url = None
    _move(
        session,
        pub,
        PublicationState.IMPORTING,
        actor,
        f"images.insert {pub.image_name} from {spec.source_uri()}",
    )
    _settle(session, pub, status, actor)
    wake_after_commit(session, Wake.GCP_REGIONS)
    return pub


def _spec(pub: ImagePublication, row: RegisteredManifest, prefix: str) -> gcp_images.ImageSpec:
    return gcp_images.ImageSpec(
        publication_id=pub.id,
        name=pub.image_name,
        family=pub.family,
        bucket=pub.bucket,
        object_name=pub.object_name,
        region=row.region.name,
        manifest_sha256=row.manifest_sha256,
        prefix=prefix,
        attempt=pub.attempt,
    )


def _settle(session: Session, pub: ImagePublication, status: str | None, actor: str) -> None:
    if status == "READY":
        _move(
            session,
            pub,
            PublicationState.PUBLISHED,
            actor,
            f"image {pub.image_name} is READY in family {pub.family}",
        )
    elif status in (None, "FAILED"):
        _move(
            session,
            pub,
            PublicationState.FAILED,
            actor,
            f"Compute could not import {pub.image_name} (status {status or 'gone'}): check that the archive "
            "is the build's rigbase-gce.tar.gz, then publish again",
        )


def importing(session: Session) -> list[str]:
    return list(
        session.scalars(
            select(ImagePublication.id).where(ImagePublication.state == PublicationState.IMPORTING)
        )
    )


def refresh(session: Session, pub_id: str, *, actor: str) -> None:
    """The reconciler's step: an importing image's status from Compute."""
    pub = get(session, pub_id)
    if PublicationState(pub.state) != PublicationState.IMPORTING:
        return
    prov = session.get_one(Provider, pub.provider_id)
    status = gcp_images.status(
        gcp.driver(session).context(provider_service.config_of(session, prov)), pub.image_name
    )
    if status != "PENDING":
        _settle(session, pub, status, actor)


def source_image(session: Session, region: Region) -> str | None:
    """What the region's VMs boot: its family, once an image of it is published; None before."""
    family = session.scalar(
        select(ImagePublication.family)
        .join(RegisteredManifest, RegisteredManifest.id == ImagePublication.manifest_id)
        .where(
            RegisteredManifest.region_id == region.id,
            ImagePublication.provider_id == region.provider_id,
            ImagePublication.state == PublicationState.PUBLISHED,
        )
        .limit(1)
    )
    if family is None:
        return None
    project = (region.provider.public_config or {}).get("project_id", "")
    return gcp_images.source_image(project, family)


def of_manifests(session: Session, manifest_ids: list[str]) -> dict[str, list[ImagePublication]]:
    out: dict[str, list[ImagePublication]] = {m: [] for m in manifest_ids}
    if manifest_ids:
        rows = session.scalars(select(ImagePublication).where(ImagePublication.manifest_id.in_(manifest_ids)))
        for pub in rows:
            out[pub.manifest_id].append(pub)
    return out
