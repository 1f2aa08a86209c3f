"""/v1/reservations: add, list, show (desired and actual), remove, assign, unassign, history."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Operator
from provisioner.api.schemas import EventOut, Page
from provisioner.domain.states import ActualState, ReservationState
from provisioner.services import reservations as service
from provisioner.store.regional_models import Reservation

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])


class ReservationIn(BaseModel):
    name: str
    region: str
    hostname: str = Field(description="DNS label, published as HOSTNAME.local")
    port: int = Field(description="1024-65535, unique in the region")
    protocol: str = "tcp"


class AssignIn(BaseModel):
    node: str


class DesiredOut(BaseModel):
    state: str
    node: str | None
    node_id: str | None


class ActualOut(BaseModel):
    state: str | None = Field(
        description="pending until the node reports; then published, mapped, conflict or error"
    )
    reason: str | None
    address: str | None = Field(description="LAN address HOST.local resolves to")
    external_address: str | None = Field(description="IP:PORT reachable from outside when mapped over UPnP")
    mdns: str | None
    upnp: str | None
    reported_at: datetime | None


class ReservationOut(BaseModel):
    id: str
    name: str
    region: str
    region_id: str
    hostname: str
    fqdn: str
    port: int
    protocol: str
    state: str = Field(description="unassigned; for an assigned reservation, the node's actual state")
    node: str | None
    desired: DesiredOut
    actual: ActualOut
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, r: Reservation) -> ReservationOut:
        node = r.node.name if r.node is not None else None
        shown = (
            (r.actual_state or ActualState.PENDING.value) if r.state == ReservationState.ASSIGNED else r.state
        )
        return cls(
            id=r.id,
            name=r.name,
            region=r.region.name,
            region_id=r.region_id,
            hostname=r.hostname,
            fqdn=f"{r.hostname}.local",
            port=r.port,
            protocol=r.protocol,
            state=shown,
            node=node,
            desired=DesiredOut(state=r.state, node=node, node_id=r.node_id),
            actual=ActualOut(
                state=r.actual_state,
                reason=r.actual_reason,
                address=r.address,
                external_address=r.external_address,
                mdns=r.mdns,
                upnp=r.upnp,
                reported_at=r.reported_at,
            ),
            created_at=r.created_at,
            updated_at=r.updated_at,
        )


@router.post("", status_code=201)
def add(body: ReservationIn, session: Db, actor: Operator) -> ReservationOut:
    return ReservationOut.of(
        service.add(
            session,
            body.name,
            region=body.region,
            hostname=body.hostname,
            port=body.port,
            protocol=body.protocol,
            actor=actor,
        )
    )


@router.get("")
def list_reservations(session: Db, region: str | None = None) -> Page[ReservationOut]:
    return Page(items=[ReservationOut.of(r) for r in service.list_all(session, region)])


@router.get("/{ref}")
def show(ref: str, session: Db, region: str | None = None) -> ReservationOut:
    return ReservationOut.of(service.get(session, ref, region))


@router.delete("/{ref}")
def remove(ref: str, session: Db, actor: Operator, region: str | None = None) -> ReservationOut:
    return ReservationOut.of(service.remove(session, ref, region=region, actor=actor))


@router.post("/{ref}/assign")
def assign(
    ref: str, body: AssignIn, session: Db, actor: Operator, region: str | None = None
) -> ReservationOut:
    return ReservationOut.of(service.assign(session, ref, node=body.node, region=region, actor=actor))


@router.post("/{ref}/unassign")
def unassign(ref: str, session: Db, actor: Operator, region: str | None = None) -> ReservationOut:
    return ReservationOut.of(service.unassign(session, ref, region=region, actor=actor))


@router.get("/{ref}/history")
def history(ref: str, session: Db, region: str | None = None) -> Page[EventOut]:
    return Page(items=[EventOut.of(e) for e in service.history(session, ref, region)])
