"""The public price list: credits per GPU-hour a customer pays for a GPU type on another account's region
(docs/billing.md "Public jobs"). The operator's price (`provision price set`, table gpu_prices) wins; else
the default of domain/billing_rules.py (the product rules' A100 at 2.78); else the GPU's usage fee, at which
its
region owner earns nothing. A price is never below the usage fee of its class (the owner would owe).

The jobs service locks `price_for(session, gpu_type)` into a job at create (docs/jobs.md "Price")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts import catalogue
from contracts.catalogue import GpuClass
from contracts.errors import InvalidInput, NotFound
from contracts.gpu_types import GPU_TYPES, resolve_gpu_type
from provisioner.domain import billing_rules as rules
from provisioner.domain.roles import Action, Principal
from provisioner.domain.text import printable
from provisioner.store.billing_models import GpuPrice


@lru_cache(maxsize=4)
def _classes_in(directory: Path) -> dict[str, GpuClass]:
    return rules.gpu_classes(catalogue.read(directory / "gpus.yaml"))


@lru_cache(maxsize=1)
def _classes() -> dict[str, GpuClass]:
    """The shipped catalogue's classes, read once per process (metering asks for every job)."""
    return _classes_in(catalogue.catalogue_dir())


def gpu_class_of(gpu_type: str | None) -> GpuClass | None:
    """The catalogue's fee class of a GPU type (regions/gpus.yaml); None for a CPU-only job. A type the
    catalogue does not list pays the highest class's fee (billing_rules.UNKNOWN_GPU_CLASS)."""
    if not gpu_type:
        return None
    return _classes().get(gpu_type, rules.UNKNOWN_GPU_CLASS)


@dataclass(frozen=True)
class PriceRow:
    gpu_type: str
    gpu_class: GpuClass
    usage_fee_per_gpu_hour: Decimal
    price_per_gpu_hour: Decimal
    owner_earnings_per_gpu_hour: Decimal
    source: str  # "set" (by an operator), "default" (billing_rules) or "usage fee"
    updated_by: str | None = None


def _row(gpu_type: str, stored: GpuPrice | None) -> PriceRow:
    cls = gpu_class_of(gpu_type) or rules.UNKNOWN_GPU_CLASS
    fee = rules.usage_fee_per_gpu_hour(cls)
    if stored is not None:
        price, source = rules.from_micros(stored.price_micros), "set"
    elif gpu_type in rules.DEFAULT_PUBLIC_PRICE_PER_GPU_HOUR:
        price, source = rules.credits(rules.DEFAULT_PUBLIC_PRICE_PER_GPU_HOUR[gpu_type]), "default"
    else:
        price, source = rules.credits(fee), "usage fee"
    return PriceRow(
        gpu_type=gpu_type,
        gpu_class=cls,
        usage_fee_per_gpu_hour=rules.credits(fee),
        price_per_gpu_hour=price,
        owner_earnings_per_gpu_hour=rules.credits(rules.earnings_per_gpu_hour(price, cls)),
        source=source,
        updated_by=stored.updated_by if stored is not None else None,
    )


def list_prices(session: Session) -> list[PriceRow]:
    """Every catalogue GPU type, in catalogue order."""
    stored = {p.gpu_type: p for p in session.scalars(select(GpuPrice))}
    return [_row(t, stored.get(t)) for t in GPU_TYPES]


def catalogue_type(name: str) -> str:
    """The one catalogue GPU type `name` means (any spelling job files use), or a one-line refusal."""
    try:
        found = resolve_gpu_type(name)
    except ValueError as exc:
        raise NotFound(f"{exc} (see `provision price list`)", code="unknown_gpu_type") from None
    if len(found) != 1:
        raise NotFound(f"'{name}' means {' and '.join(found)}: name one of them", code="unknown_gpu_type")
    return found[0]


def price_row(session: Session, gpu_type: str) -> PriceRow:
    name = catalogue_type(gpu_type)
    return _row(name, session.get(GpuPrice, name))


def price_for(session: Session, gpu_type: str | None) -> Decimal:
    """Credits per GPU-hour a public job of `gpu_type` pays (0 for a CPU-only job: no GPU-hours)."""
    if not gpu_type:
        return rules.credits(0)
    if gpu_type not in GPU_TYPES:
        return rules.credits(rules.usage_fee_per_gpu_hour(rules.UNKNOWN_GPU_CLASS))
    return _row(gpu_type, session.get(GpuPrice, gpu_type)).price_per_gpu_hour


# what an operator may type: no exponent (1e999999999 overflows the scale), no '_' or '+', ASCII digits only
# (Decimal also reads full-width ones)
PLAIN_DECIMAL: Final = re.compile(r"-?[0-9]{1,24}(\.[0-9]{1,24})?", re.ASCII)


def parse_credits(text: str, what: str = "price") -> Decimal:
    """An amount an operator typed: a plain decimal (PLAIN_DECIMAL) with at most SCALE decimal places, at
    most AMOUNT_MAX either way. The size is checked before the scale: a number longer than Decimal's 28
    digits cannot be put at the ledger's scale (InvalidOperation, which was a 500), nor held by the
    ledger."""
    if not PLAIN_DECIMAL.fullmatch(text.strip()):
        raise InvalidInput(
            f"{what} '{printable(text, 40)}' is not a number of credits: write a plain decimal (digits 0-9, "
            "an optional leading '-' and one '.'), e.g. 2.78",
            code="invalid_credits",
        )
    value = Decimal(text.strip())
    if not (abs(value) <= rules.AMOUNT_MAX and value == rules.credits(value)):
        raise InvalidInput(
            f"{what} '{printable(text, 40)}' must be a finite number of at most {rules.AMOUNT_MAX:,} "
            f"credits either way, with at most {rules.SCALE} decimal places",
            code="invalid_credits",
        )
    return rules.credits(value)


def set_price(session: Session, principal: Principal, gpu_type: str, price: Decimal) -> PriceRow:
    """Set a GPU type's public price (admins of the root account: it is what every customer pays).
    Jobs already placed keep the price fixed at their placement."""
    principal.require(Action.MANAGE_ACCOUNTS)
    name = catalogue_type(gpu_type)
    fee = rules.usage_fee_per_gpu_hour(gpu_class_of(name))
    if not fee <= price <= rules.PRICE_MAX:
        raise InvalidInput(
            f"price {price} for {name} must be between its usage fee {rules.credits(fee)} and "
            f"{rules.PRICE_MAX} credits per GPU-hour",
            code="price_out_of_range",
        )
    row = session.get(GpuPrice, name)
    if row is None:
        row = GpuPrice(gpu_type=name, price_micros=rules.to_micros(price), updated_by=principal.actor)
        session.add(row)
    else:
        row.price_micros = rules.to_micros(price)
        row.updated_by = principal.actor
    session.flush()
    return _row(name, row)


def estimate(
    session: Session, gpu_type: str | None, gpu_count: int, *, public: bool, federated: str | None
) -> rules.HourEstimate:
    """One hour of a job under the rules, at today's price (`provision billing estimate`). A family name
    ("A100") is accepted when all its types cost the same."""
    if federated is not None and federated not in rules.FEDERATED_FEE_PER_WORKER_HOUR:
        kinds = ", ".join(rules.FEDERATED_FEE_PER_WORKER_HOUR)
        raise InvalidInput(f"federated '{federated}' is not a job kind with a fee: use one of {kinds}")
    if not 0 <= gpu_count <= 64:
        raise InvalidInput(f"gpu count {gpu_count} must be between 0 and 64", code="invalid_gpu_count")
    name: str | None = None
    if gpu_count > 0:
        if not gpu_type:
            raise InvalidInput("name the GPU type (--gpu-type), or use --gpu-count 0 for a CPU-only job")
        try:
            found = resolve_gpu_type(gpu_type)
        except ValueError as exc:
            raise NotFound(f"{exc} (see `provision price list`)", code="unknown_gpu_type") from None
        rows = [_row(t, session.get(GpuPrice, t)) for t in found]
        if len({(r.gpu_class, r.price_per_gpu_hour) for r in rows}) != 1:
            raise NotFound(
                f"'{gpu_type}' means {' and '.join(found)}: name one of them", code="unknown_gpu_type"
            )
        name = found[0] if len(found) == 1 else gpu_type
        return rules.estimate(
            name,
            rows[0].gpu_class,
            gpu_count,
            public=public,
            federated=federated,
            public_price=rows[0].price_per_gpu_hour,
        )
    return rules.estimate(None, None, 0, public=public, federated=federated, public_price=Decimal(0))
