"""A region's rigbase image marked published, for the in-process GCP tests whose subject is what comes
after it (the storage node, burst VMs): the manifest is signed and registered through the real service;
only the upload and import (tests/provisioner/gcp/test_image_publish.py's subject) are skipped by writing
the publication row as the import would leave it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.states import PublicationState
from provisioner.providers.gcp import images as gcp_images
from provisioner.services.cloud import image_publish
from provisioner.services.fleet import images
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.image_models import ImagePublication
from tests.fixtures.manifests import Builder

ACTOR = "operator:test"


def publish_image(sessions: sessionmaker[Session], region: str, key_dir: Path) -> str:
    """Register a signed manifest with a gce target for `region` and record it published; returns the
    source image its VMs boot."""
    builder = Builder(key_dir)
    doc = builder.manifest(region=region)
    doc["region"]["provider"] = "gcp"
    doc["targets"] = {"gce": {"file": "rigbase-gce.tar.gz", "sha256": "c" * 64, "size": 1 << 20}}
    data, sig = builder.signed(doc)
    with session_scope(sessions) as s:
        images.trust_key(s, builder.public, name=f"builder-{region}", actor=ACTOR)
        row = images.register(s, data, sig, region=region, actor=ACTOR)
        target = region_service.get(s, region)
        s.add(
            ImagePublication(
                manifest_id=row.id,
                provider_id=target.provider_id,
                target="gce",
                state=PublicationState.PUBLISHED.value,
                bucket="rigbase-images-test",
                object_name=gcp_images.object_name(row.manifest_sha256, "rigbase-gce.tar.gz"),
                size=1 << 20,
                crc32c="AAAAAA==",
                image_name=gcp_images.image_name("rigbase", region, row.manifest_sha256),
                family=gcp_images.family("rigbase", region),
                created_by=ACTOR,
            )
        )
        s.flush()
        source = image_publish.source_image(s, target)
    assert source is not None
    return source
