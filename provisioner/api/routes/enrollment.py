"""Operator routes of enrollment: join tokens and bundles per region, the region's EK setting,
trusted TPM vendor CAs, pending minions, and retrying an errored node."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from contracts.bundle import check_control_plane_url
from provisioner.adapters import tls
from provisioner.api.deps import Db, Operator, TrustRoot
from provisioner.api.schemas import NodeOut, Page, RegionOut
from provisioner.domain.pages import REFUSALS_PAGE
from provisioner.domain.states import MinionRejection, TrustState, join_token_state
from provisioner.services.fleet import join_operator, join_tokens, rejections, tpm_cas
from provisioner.services.fleet import pending as pending_service
from provisioner.services.regions import regions as region_service
from provisioner.store.join_models import JoinToken, RejectedMinion, TpmVendorCa

router = APIRouter(tags=["enrollment"])


class TokenIn(BaseModel):
    ttl: str = join_tokens.DEFAULT_TTL


class TokenOut(BaseModel):
    id: str
    region: str
    expires_at: datetime | None
    revoked_at: datetime | None
    created_at: datetime
    state: str
    token: str | None = None  # only in the answer that created it

    @classmethod
    def of(cls, row: JoinToken, region: str, token: str | None = None) -> TokenOut:
        state = join_token_state(row.revoked_at, row.expires_at).value
        return cls(
            id=row.id,
            region=region,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
            created_at=row.created_at,
            state=state,
            token=token,
        )


class BundleIn(BaseModel):
    control_plane_url: str
    ca_certificate: str | None = None
    ttl: str | None = Field(
        None,
        description=f"a new token of this lifetime; none: the region's live bundle token if one enrols "
        f"for a day more, else a new one of {join_tokens.DEFAULT_TTL}",
    )


class RegionAttestationIn(BaseModel):
    """The region's attestation opt-ins; a field left out (or null) stays as it is."""

    model_config = ConfigDict(extra="forbid")

    allow_ek_without_cert: bool | None = None
    allow_devices_without_tpm: bool | None = None


class CaIn(BaseModel):
    pem: str


class CaOut(BaseModel):
    id: str
    subject: str
    sha256: str
    not_after: datetime
    created_at: datetime
    state: str = TrustState.TRUSTED.value

    @classmethod
    def of(cls, row: TpmVendorCa) -> CaOut:
        return cls(
            id=row.id,
            subject=row.subject,
            sha256=row.sha256,
            not_after=row.not_after,
            created_at=row.created_at,
        )


class RetryIn(BaseModel):
    accept_pcrs: bool = False


class RejectIn(BaseModel):
    minion_id: str
    reason: str | None = None


class RejectedOut(BaseModel):
    minion_id: str
    reason: str | None
    created_by: str
    created_at: datetime | None
    state: str = MinionRejection.REJECTED.value

    @classmethod
    def of(cls, row: RejectedMinion) -> RejectedOut:
        return cls(
            minion_id=row.minion_id, reason=row.reason, created_by=row.created_by, created_at=row.created_at
        )


@router.post("/v1/regions/{ref}/join-tokens", status_code=201)
def issue_token(ref: str, body: TokenIn, session: Db, actor: Operator) -> TokenOut:
    row, token = join_tokens.issue(session, ref, ttl=body.ttl, actor=actor)
    return TokenOut.of(row, region_service.get(session, ref).name, token)


@router.get("/v1/regions/{ref}/join-tokens")
def list_tokens(ref: str, session: Db) -> Page[TokenOut]:
    name = region_service.get(session, ref).name
    return Page(items=[TokenOut.of(r, name) for r in join_tokens.list_for(session, ref)])


@router.delete("/v1/regions/{ref}/join-tokens")
def revoke_tokens(ref: str, session: Db, actor: Operator) -> dict[str, Any]:
    return {"revoked": join_tokens.revoke(session, ref, actor=actor)}


@router.delete("/v1/regions/{ref}/join-tokens/{token_id}")
def revoke_token(ref: str, token_id: str, session: Db, actor: Operator) -> TokenOut:
    """Revoke one join token (idempotent: an already revoked one is answered as it is)."""
    row, _changed = join_tokens.revoke_one(session, ref, token_id, actor=actor)
    return TokenOut.of(row, region_service.get(session, ref).name)


@router.post("/v1/regions/{ref}/bundle", status_code=201)
def bundle(ref: str, body: BundleIn, session: Db, actor: Operator, request: Request) -> dict[str, Any]:
    """The region's enrollment bundle (docs/enrollment-bundle.md): its live bundle token again, or with a
    `ttl` (or none live) a new one; `token_reused` says which. Without a `ca_certificate` the bundle
    pins this control plane's own CA (docs/control-plane.md, "TLS")."""
    settings = request.app.state.runtime.settings
    check_control_plane_url(body.control_plane_url)  # before the token is stored
    tls.check_node_url(body.control_plane_url, settings)
    ca_certificate = body.ca_certificate or tls.node_trust(settings)
    row, token, reused = join_tokens.for_bundle(session, ref, ttl=body.ttl, actor=actor)
    made = join_tokens.bundle(
        session,
        region_service.get(session, ref),
        token,
        control_plane_url=body.control_plane_url,
        ca_certificate=ca_certificate,
    )
    return {**made, "token_id": row.id, "token_reused": reused}


@router.post("/v1/regions/{ref}/attestation")
def region_attestation(ref: str, body: RegionAttestationIn, session: Db, actor: Operator) -> RegionOut:
    return RegionOut.of(
        join_operator.set_region_attestation(
            session,
            ref,
            allow_ek_without_cert=body.allow_ek_without_cert,
            allow_devices_without_tpm=body.allow_devices_without_tpm,
            actor=actor,
        )
    )


@router.post("/v1/tpm-cas", status_code=201, dependencies=[TrustRoot])
def add_ca(body: CaIn, session: Db, actor: Operator) -> Page[CaOut]:
    return Page(items=[CaOut.of(r) for r in tpm_cas.add(session, body.pem.encode(), actor=actor)])


@router.get("/v1/tpm-cas", dependencies=[TrustRoot])
def list_cas(session: Db) -> Page[CaOut]:
    return Page(items=[CaOut.of(r) for r in tpm_cas.list_all(session)])


@router.delete("/v1/tpm-cas/{ref}", dependencies=[TrustRoot])
def remove_ca(ref: str, session: Db, actor: Operator) -> CaOut:
    out = CaOut.of(tpm_cas.remove(session, ref, actor=actor))
    out.state = TrustState.REMOVED.value
    return out


@router.post("/v1/rejected-minions", status_code=201, dependencies=[TrustRoot])
def reject_minion(body: RejectIn, session: Db, actor: Operator) -> RejectedOut:
    """Refuse every join of this minion_id (audited) until it is unrejected; idempotent."""
    return RejectedOut.of(rejections.reject(session, body.minion_id, reason=body.reason, actor=actor))


@router.get("/v1/rejected-minions", dependencies=[TrustRoot])
def rejected_minions(session: Db) -> Page[RejectedOut]:
    return Page(items=[RejectedOut.of(r) for r in rejections.list_all(session)])


@router.delete("/v1/rejected-minions/{minion_id}", dependencies=[TrustRoot])
def unreject_minion(minion_id: str, session: Db, actor: Operator) -> dict[str, str]:
    """Let the minion join again: it shows as pending at its next attempt."""
    return {
        "minion_id": rejections.unreject(session, minion_id, actor=actor),
        "state": MinionRejection.LIFTED,
    }


@router.get("/v1/pending-minions")
def pending(session: Db, region: str | None = None) -> Page[dict[str, Any]]:
    return Page(items=pending_service.pending(session, region))


@router.post("/v1/nodes/{ref}/retry")
def retry(ref: str, body: RetryIn, session: Db, actor: Operator, region: str | None = None) -> NodeOut:
    return NodeOut.of(
        join_operator.retry(session, ref, region=region, accept_pcrs=body.accept_pcrs, actor=actor)
    )


@router.get("/v1/join-refusals")
def refusals(
    session: Db, minion_id: str | None = None, limit: int = Query(50, ge=1, le=REFUSALS_PAGE)
) -> Page[dict[str, Any]]:
    """The audit trail of refused joins and failed continuous attestation, newest first."""
    return Page(items=pending_service.refusals(session, minion_id=minion_id, limit=limit))
