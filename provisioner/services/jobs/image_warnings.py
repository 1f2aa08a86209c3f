"""What a dry run says of a job's image on the nodes it would go to, from what each node's minion last
told of its images (contracts.jobs.NodeImages, `nodes.images`): a `localhost/` image the node does not
hold (it is never pulled, so the job cannot start there), or a registry the node's last pull from failed
(every registry image is pulled at each start). A node that never told says nothing."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.images import registry_of
from contracts.jobs import NodeImages
from provisioner.domain.placement import Candidate, CandidateSource
from provisioner.store.models import Node


def with_tag(image: str) -> str:
    """`localhost/x` as podman lists it: `localhost/x:latest` (a digest or a tag stays)."""
    last = image.rsplit("/", 1)[-1]
    return image if "@" in image or ":" in last else f"{image}:latest"


def image_warnings(session: Session, image: str, chosen: Sequence[Candidate]) -> list[str]:
    ids = list(dict.fromkeys(c.id for c in chosen if c.source == CandidateSource.NODE.value))
    if not ids:
        return []
    warnings = []
    registry = registry_of(image)
    for node in session.scalars(select(Node).where(Node.id.in_(ids)).order_by(Node.name)):
        if not node.images:
            continue
        told = NodeImages.model_validate(node.images)
        if image.startswith("localhost/"):
            if with_tag(image) not in told.local:
                warnings.append(
                    f"node '{node.name}' does not hold {image}: a localhost/ image is the node's own and is "
                    "never pulled, so the job would fail to start there; build or load it on the node, or "
                    "name a registry image"
                )
        elif (pull := told.pulls.get(registry)) is not None and not pull.ok:
            warnings.append(
                f"node '{node.name}' last failed to pull from {registry} "
                f"({pull.at:%Y-%m-%d %H:%M} UTC: {pull.message or 'no message'}): {image} is pulled at "
                "each start, so the job would fail to start there unless the node reaches the registry"
            )
    return warnings
