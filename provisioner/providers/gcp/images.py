"""The rigbase image in a GCP project: the GCE target of a signed build (image-builder build --target gce)
uploaded to the project's image bucket and imported with images.insert (docs/gcp.md "The rigbase image on
GCE").

Cloud Storage (google-cloud-storage): the control plane makes the bucket on first use and opens a resumable
upload session for the archive, declaring its size and CRC32C; the CLI sends the bytes straight to that
session (the session URI is the only capability it needs: the project's key never leaves the control
plane), and the control plane then compares the finished object's size and CRC32C with what was declared.

Compute (google-cloud-compute): images.insert from the object, UEFI_COMPATIBLE (what a Shielded VM with
vTPM requires), in the region's family so VMs boot `family/<family>`: the newest published image. The
insert carries a requestId derived from the publication row, and an image of that name carrying our
labels is adopted: publishing again after a crash imports once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from provisioner.providers.base import ProvisionFailed
from provisioner.providers.gcp import naming

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

ROLE = "image"
MANIFEST_LABEL = "rigbase-manifest"
#: What a Shielded VM (Secure Boot off, vTPM and integrity monitoring on) needs of its boot image.
GUEST_OS_FEATURES: tuple[str, ...] = ("UEFI_COMPATIBLE",)
ARCHIVE_TYPE = "application/gzip"
BUCKET_LOCATION = "US"  # multi-region: images.insert reads it from any region
PUBLISH_HINT = (
    "`image-builder build --target gce --bundle REGION_BUNDLE --output DIR`, then "
    "`provision image publish DIR/manifest.json --provider gcp`"
)
WAITING_PREFIX = "waiting for a published rigbase image"


def waiting_reason(region: str) -> str:
    """The storage node's progress until its region has an image (a new region never has one: the image
    is built with the region's bundle)."""
    return f"{WAITING_PREFIX} for region {region}: {PUBLISH_HINT}"


@dataclass(frozen=True)
class ImageSpec:
    publication_id: str  # our row: the requestId derives from it
    name: str
    family: str
    bucket: str
    object_name: str
    region: str  # the rigbase region whose VMs boot it
    manifest_sha256: str
    prefix: str = naming.DEFAULT_PREFIX
    attempt: int = 0  # publishing again after a failed import

    def labels(self) -> dict[str, str]:
        return naming.labels(
            self.prefix,
            **{
                naming.REGION_LABEL: self.region,
                naming.ROLE_LABEL: ROLE,
                MANIFEST_LABEL: self.manifest_sha256[:63],
            },
        )

    def source_uri(self) -> str:
        return f"https://storage.googleapis.com/{self.bucket}/{self.object_name}"

    def request_id(self, project: str) -> str:
        return naming.request_id(project, self.publication_id, "image", str(self.attempt))


def bucket_name(project: str, prefix: str) -> str:
    """Bucket names are global: the project id makes ours unique (3–63 lowercase letters, digits, '-')."""
    return naming.gcp_name(prefix, "images", project)


def family(prefix: str, region: str) -> str:
    return naming.gcp_name(prefix, region)


def image_name(prefix: str, region: str, manifest_sha256: str) -> str:
    return naming.gcp_name(prefix, region, manifest_sha256[:16])


def object_name(manifest_sha256: str, file: str) -> str:
    return f"images/{manifest_sha256}/{file}"


def source_image(project: str, family_name: str) -> str:
    """What a VM's boot disk is made from: the newest READY image of the family."""
    return f"projects/{project}/global/images/family/{family_name}"


def ensure_bucket(ctx: GcpContext, name: str) -> None:
    """The image bucket, made on first use (uniform access, no public access): idempotent."""
    from google.api_core import exceptions

    if ctx.storage.lookup_bucket(name) is not None:
        return
    bucket = ctx.storage.bucket(name)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    try:
        ctx.storage.create_bucket(bucket, location=BUCKET_LOCATION)
    except exceptions.Conflict:
        pass  # made meanwhile (another publish), or the name is taken by another project: the upload says


def uploaded(ctx: GcpContext, bucket: str, obj: str) -> tuple[int, str] | None:
    """(size, crc32c) of the object, or None when it is not there (an upload not finished is not there)."""
    blob = ctx.storage.bucket(bucket).get_blob(obj)
    if blob is None:
        return None
    return int(blob.size or 0), str(blob.crc32c or "")


def upload_session(ctx: GcpContext, bucket: str, obj: str, *, size: int, crc32c: str) -> str:
    """A resumable upload session for exactly `size` bytes whose CRC32C must be `crc32c` (base64)."""
    blob = ctx.storage.bucket(bucket).blob(obj)
    blob.crc32c = crc32c  # sent with the session's metadata: Cloud Storage refuses a body that differs
    return str(blob.create_resumable_upload_session(content_type=ARCHIVE_TYPE, size=size))


def status(ctx: GcpContext, name: str) -> str | None:
    """The image's status (PENDING, READY, FAILED, DELETING), or None when there is none of that name."""
    from google.api_core import exceptions

    try:
        return str(ctx.images.get(project=ctx.project, image=name).status)
    except exceptions.NotFound:
        return None


def delete_failed(ctx: GcpContext, name: str, prefix: str) -> bool:
    """Delete our image of that name if its import FAILED (its name is needed again); True if deleted."""
    from google.api_core import exceptions

    try:
        found = ctx.images.get(project=ctx.project, image=name)
    except exceptions.NotFound:
        return False
    if found.status != "FAILED" or dict(found.labels).get(naming.MANAGED_LABEL) != naming.label_value(prefix):
        return False
    try:
        ctx.images.delete(project=ctx.project, image=name)
    except exceptions.NotFound:
        pass
    return True


def insert(ctx: GcpContext, spec: ImageSpec) -> str:
    """Import the image (or adopt ours of that name); returns its status. Refuses a same-named image
    without our labels."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    try:
        found = ctx.images.get(project=ctx.project, image=spec.name)
    except exceptions.NotFound:
        found = None
    if found is not None:
        if dict(found.labels).get(naming.MANAGED_LABEL) != naming.label_value(spec.prefix):
            raise ProvisionFailed(
                f"an image named {spec.name} exists in project {ctx.project} and is not rigbase's: "
                "delete or rename it, then publish again"
            )
        return str(found.status)
    image = compute_v1.Image(
        name=spec.name,
        family=spec.family,
        description=f"rigbase node image for region {spec.region} (manifest sha256 {spec.manifest_sha256})",
        labels=spec.labels(),
        raw_disk=compute_v1.RawDisk(source=spec.source_uri()),
        guest_os_features=[compute_v1.GuestOsFeature(type_=f) for f in GUEST_OS_FEATURES],
    )
    try:
        ctx.images.insert(
            request=compute_v1.InsertImageRequest(
                project=ctx.project, image_resource=image, request_id=spec.request_id(ctx.project)
            )
        )
    except exceptions.Conflict:
        pass  # made by the first attempt: status below
    except exceptions.GoogleAPICallError as exc:
        raise ProvisionFailed(f"images.insert of {spec.name} failed: {exc.message}") from None
    return status(ctx, spec.name) or "PENDING"
