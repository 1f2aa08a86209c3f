"""Store models: trusted image-builder keys and registered image manifests.

A manifest row keeps the exact signed bytes and the signature, so the trust decision can be re-checked
later (`provision image show` prints the signer; an auditor can re-run `image-builder verify`). The
expected PCR values are copied into columns because the join verifier reads them on every join and
every continuous attestation — parsing the manifest there would be wasted work."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.models import Base, Provider, Region, UTCDateTime, new_id, utcnow


class ImageKey(Base):
    """An image builder's Ed25519 public key the operator trusts (`provision image trust-key`)."""

    __tablename__ = "image_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("ikey"))
    name: Mapped[str] = mapped_column(String(128))
    # sha256 of the raw 32-byte key: what the manifest's builder.key_sha256 names
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    public_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128))


class RegisteredManifest(Base):
    """A signed image manifest registered for one region (the document's schema is
    contracts.manifest.ImageManifest). Several per region are a rollout: a node matching any of them
    passes."""

    __tablename__ = "image_manifests"
    __table_args__ = (UniqueConstraint("region_id", "manifest_sha256", name="uq_image_manifests_region_sha"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("img"))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("image_keys.id"), index=True)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[str] = mapped_column(Text)  # the exact signed bytes (canonical JSON is ASCII)
    signature: Mapped[str] = mapped_column(Text)  # base64, as the .sig file holds it
    image_sha256: Mapped[str] = mapped_column(String(64))
    uki_sha256: Mapped[str] = mapped_column(String(64))
    verity_root_hash: Mapped[str] = mapped_column(String(128))
    pcr11: Mapped[str] = mapped_column(String(64))  # phase sysinit:ready, what a running node reports
    pcr12: Mapped[str] = mapped_column(String(64))
    pcr4: Mapped[str | None] = mapped_column(
        String(64)
    )  # the manifest's direct-USB-boot value, if it has one
    # the Authenticode digests of the EFI applications the image boots (manifest pe_hashes, sorted):
    # what the event log's PCR 4 applications must be among (provisioner/attestation/boot_path.py)
    pe_hashes: Mapped[list[str] | None] = mapped_column(JSON)
    packages: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128))

    region: Mapped[Region] = relationship(lazy="joined")
    key: Mapped[ImageKey] = relationship(lazy="joined")


class ImagePublication(Base):
    """A registered manifest's cloud target published to a provider (`provision image publish`): for GCP,
    the GCE disk uploaded to the project's image bucket, then imported as an image in the region's
    family (services/cloud/image_publish.py). One row per manifest, provider and target: publishing again
    resumes it."""

    __tablename__ = "image_publications"
    __table_args__ = (
        UniqueConstraint(
            "manifest_id", "provider_id", "target", name="uq_image_publications_manifest_provider_target"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("pub"))
    manifest_id: Mapped[str] = mapped_column(ForeignKey("image_manifests.id"), index=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), index=True)
    target: Mapped[str] = mapped_column(String(16))  # the manifest's targets.<name>, e.g. gce
    state: Mapped[str] = mapped_column(String(16))  # domain.states.PublicationState
    reason: Mapped[str | None] = mapped_column(Text)
    bucket: Mapped[str] = mapped_column(String(222))
    object_name: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column(BigInteger)  # the archive's bytes, from the signed manifest
    crc32c: Mapped[str] = mapped_column(
        String(16)
    )  # base64, as Cloud Storage reports it; declared by the CLI
    # the resumable upload session the CLI sends the bytes to: a bearer capability, kept only while uploading
    upload_url: Mapped[str | None] = mapped_column(Text)
    image_name: Mapped[str] = mapped_column(String(63))
    family: Mapped[str] = mapped_column(String(63))
    # publishing again after a failed import: the failed image is deleted and the insert's requestId
    # derives from this, so Compute does not answer with the failed import's operation
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    manifest: Mapped[RegisteredManifest] = relationship()
    provider: Mapped[Provider] = relationship(lazy="joined")
