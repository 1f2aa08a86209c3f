"""Providers: enable (validate through the provider module, store config), list, show, remove."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound
from provisioner.domain.states import PROVIDER_TRANSITIONS, ProviderState, RegionState
from provisioner.providers.base import REGISTRY, Feature, ProviderConfig, provider_for
from provisioner.services.common import lifecycle
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import FEATURE_WORK, wake_after_commit
from provisioner.store.models import Provider, Region, new_id

KIND = "provider"


def transition(
    session: Session, provider: Provider, to: ProviderState, *, actor: str, reason: str | None = None
) -> None:
    """The only way a provider's state changes: checked against the table, recorded in the audit trail."""
    lifecycle.apply(
        session,
        provider,
        to,
        kind=KIND,
        name=provider.kind,
        table=PROVIDER_TRANSITIONS,
        actor=actor,
        reason=reason,
    )


def enable(session: Session, kind: str, raw: Mapping[str, Any], *, actor: str) -> Provider:
    runtime = runtime_of(session)
    impl = runtime.provider(kind)
    payment_mode = str(raw.get("payment_mode") or impl.payment_modes[0])
    if payment_mode not in impl.payment_modes:
        raise InvalidInput(
            f"payment mode '{payment_mode}' is not offered by {kind}: use {', '.join(impl.payment_modes)}"
        )
    config = impl.validate_config({**raw, "payment_mode": payment_mode})
    if session.scalar(select(Provider).where(Provider.kind == kind, Provider.state != ProviderState.REMOVED)):
        raise Conflict(f"provider '{kind}' is already enabled: see `provision provider show {kind}`")
    provider = Provider(
        id=new_id("prv"),
        kind=kind,
        payment_mode=config.payment_mode,
        public_config=dict(config.public),
        sealed_config=runtime.sealer.seal(config.secret) if config.secret else None,
    )
    session.add(provider)
    transition(session, provider, ProviderState.NEW, actor=actor, reason="enabled by operator")
    # physical has nothing to set up; providers with plan_enable actions stay `new` for their reconciler
    if not impl.plan_enable(config):
        transition(session, provider, ProviderState.ENABLED, actor=actor)
    else:
        wake_after_commit(session, FEATURE_WORK[Feature.BOOTSTRAP])
    return provider


def config_of(session: Session, provider: Provider) -> ProviderConfig:
    """The stored configuration with the secret unsealed (for the provider's lifecycle calls; never
    leaves this process)."""
    secret = runtime_of(session).sealer.unseal(provider.sealed_config) if provider.sealed_config else None
    return ProviderConfig(
        payment_mode=provider.payment_mode, public=dict(provider.public_config or {}), secret=secret
    )


def list_all(session: Session) -> list[Provider]:
    return list(
        session.scalars(
            select(Provider).where(Provider.state != ProviderState.REMOVED).order_by(Provider.kind)
        )
    )


def get(session: Session, ref: str) -> Provider:
    """By kind (`physical`) or id."""
    provider = session.scalar(
        select(Provider).where(
            (Provider.kind == ref) | (Provider.id == ref), Provider.state != ProviderState.REMOVED
        )
    )
    if provider is None:
        if ref not in REGISTRY and not ref.startswith("prv_"):
            provider_for(ref)  # raises InvalidInput naming the kinds that exist
        raise NotFound(f"provider '{ref}' is not enabled: see `provision provider list`")
    return provider


def remove(session: Session, ref: str, *, actor: str) -> Provider:
    provider = get(session, ref)
    live = session.scalars(
        select(Region.name).where(Region.provider_id == provider.id, Region.state != RegionState.REMOVED)
    ).all()
    if live:
        raise Conflict(
            f"provider '{provider.kind}' still has regions ({', '.join(sorted(live))}): remove them first",
            code="provider_in_use",
        )
    impl = runtime_of(session).provider(provider.kind)
    if impl.plan_enable(ProviderConfig(provider.payment_mode, dict(provider.public_config or {}))):
        # it made things in the operator's account: its reconciler deletes exactly those, then → removed
        if provider.state != ProviderState.REMOVING:
            transition(
                session, provider, ProviderState.REMOVING, actor=actor, reason="removal requested by operator"
            )
        wake_after_commit(session, FEATURE_WORK[Feature.BOOTSTRAP])
        return provider
    transition(session, provider, ProviderState.REMOVED, actor=actor, reason="removed by operator")
    return provider
