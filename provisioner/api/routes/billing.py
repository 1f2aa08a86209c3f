"""/v1/billing: what an hour costs and earns (estimate), balances, the ledger, and the public GPU price list
(docs/billing.md). An account sees its own balance and ledger; admins of the root account may name any
account, and `platform` (the fees this control plane collected)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from contracts.errors import InvalidInput
from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.domain import billing_rules as rules
from provisioner.domain import clock
from provisioner.domain.roles import Action
from provisioner.domain.roles import Principal as PrincipalValue
from provisioner.services.accounts import accounts
from provisioner.services.billing import ledger, prices
from provisioner.store.billing_models import LedgerEntry

router = APIRouter(prefix="/v1/billing", tags=["billing"], responses=documented(403, 404))

Credits = Annotated[Decimal, Field(description="credits, a decimal string with 6 decimal places")]


class EstimateOut(BaseModel):
    gpu_type: str | None
    gpu_class: str | None
    gpu_count: int
    public: bool
    federated: str | None
    price_per_gpu_hour: Credits
    usage_fee_per_gpu_hour: Credits
    usage_fee: Credits
    price: Credits
    federated_fee: Credits
    owner_earnings_per_gpu_hour: Credits
    owner_earnings: Credits
    total_cost: Credits


@router.get("/estimate")
def estimate(
    session: Db,
    principal: Principal,
    gpu_type: str | None = Query(None, max_length=64),
    gpu_count: int = Query(1, ge=0, le=64),
    public: bool = False,
    federated: str | None = Query(None, max_length=16, description="training | inference | endpoint"),
) -> EstimateOut:
    e = prices.estimate(session, gpu_type, gpu_count, public=public, federated=federated)
    return EstimateOut(**{**e.__dict__, "gpu_class": e.gpu_class.value if e.gpu_class else None})


def _ledger_accounts(session: Db, principal: PrincipalValue, ref: str | None) -> tuple[str, str]:
    """(name, ledger account id) the caller may read: its own account, any for the root's admins."""
    if ref == rules.PLATFORM:
        principal.require(Action.MANAGE_ACCOUNTS)
        return rules.PLATFORM, rules.PLATFORM
    if ref is None:
        own = accounts.get_visible(session, principal, principal.account_id)
        return own.name, own.id
    row = accounts.get_visible(session, principal, ref)
    return row.name, row.id


class BalanceOut(BaseModel):
    account: str
    account_id: str
    balance: Credits = Field(description="credits received minus credits paid, all entries")
    earned_pending: Credits = Field(description="public-job earnings not yet moved to the balance")
    can_start_public_jobs: bool = Field(description="balance above zero: jobs may start on public capacity")
    as_of: datetime


@router.get("/balance")
def balance(
    session: Db, principal: Principal, account: str | None = Query(None, max_length=63)
) -> BalanceOut:
    name, account_id = _ledger_accounts(session, principal, account)
    value = ledger.balance(session, account_id)
    return BalanceOut(
        account=name,
        account_id=account_id,
        balance=value,
        earned_pending=ledger.balance(session, rules.earned_account(account_id)),
        can_start_public_jobs=value > 0,
        as_of=clock.now(),
    )


class EntryOut(BaseModel):
    id: int
    at: datetime
    rule: str
    subject: str
    payer: str
    payee: str
    amount: Credits
    quantity: Credits
    job_id: str | None
    worker: int | None
    hour: int | None
    day: str | None
    region_id: str | None
    gpu_type: str | None
    period_start: datetime | None
    period_end: datetime | None
    memo: str | None

    @classmethod
    def of(cls, row: LedgerEntry) -> EntryOut:
        return cls(
            id=row.id,
            at=row.at,
            rule=row.rule,
            subject=row.subject,
            payer=row.payer,
            payee=row.payee,
            amount=rules.from_micros(row.amount_micros),
            quantity=rules.from_micros(row.quantity_micros),
            job_id=row.job_id,
            worker=row.worker,
            hour=row.hour,
            day=row.day,
            region_id=row.region_id,
            gpu_type=row.gpu_type,
            period_start=row.period_start,
            period_end=row.period_end,
            memo=row.memo,
        )


@router.get("/ledger")
def ledger_entries(
    session: Db,
    principal: Principal,
    account: str | None = Query(None, max_length=63),
    since: datetime | None = None,
    job: str | None = Query(None, max_length=32),
    limit: int = Query(1000, ge=1, le=10000),
) -> Page[EntryOut]:
    _, account_id = _ledger_accounts(session, principal, account)
    ids = [account_id] if account_id == rules.PLATFORM else [account_id, rules.earned_account(account_id)]
    rows = ledger.entries(session, ids, since=since, job_id=job, limit=limit)
    return Page(items=[EntryOut.of(r) for r in rows])


class PriceOut(BaseModel):
    gpu_type: str
    gpu_class: str
    usage_fee_per_gpu_hour: Credits
    price_per_gpu_hour: Credits
    owner_earnings_per_gpu_hour: Credits
    source: str = Field(description="set (by an operator), default (the rules) or usage fee (no price yet)")
    updated_by: str | None

    @classmethod
    def of(cls, row: prices.PriceRow) -> PriceOut:
        return cls(**{**row.__dict__, "gpu_class": row.gpu_class.value})


class PriceIn(BaseModel):
    gpu_type: str = Field(max_length=64)
    price: str = Field(max_length=32, description='credits per GPU-hour, e.g. "2.78"')


@router.get("/prices")
def list_prices(session: Db, principal: Principal) -> Page[PriceOut]:
    return Page(items=[PriceOut.of(r) for r in prices.list_prices(session)])


@router.post("/prices")
def set_price(body: PriceIn, session: Db, principal: Principal) -> PriceOut:
    return PriceOut.of(prices.set_price(session, principal, body.gpu_type, prices.parse_credits(body.price)))


class UsageOut(BaseModel):
    job_id: str | None
    gpu_type: str | None
    rule: str
    quantity: Credits = Field(description="GPU-hours, worker-hours or device-days")
    paid: Credits
    earned: Credits


@router.get("/usage")
def usage(
    session: Db,
    principal: Principal,
    month: str | None = Query(None, max_length=32, description="YYYY-MM (UTC)"),
    day: str | None = Query(None, max_length=32, description="YYYY-MM-DD (UTC); instead of month"),
    account: str | None = Query(None, max_length=63),
) -> Page[UsageOut]:
    """What an account paid and earned in a month or on one UTC day, per job, GPU type and rule."""
    if (month is None) == (day is None):
        raise InvalidInput("give a month (YYYY-MM) or a day (YYYY-MM-DD), not both", code="invalid_period")
    _, account_id = _ledger_accounts(session, principal, account)
    period = day if day is not None else month
    assert period is not None
    return Page(items=[UsageOut(**r.__dict__) for r in ledger.usage(session, account_id, period)])


class CreditIn(BaseModel):
    account: str = Field(max_length=63, description="the account's name or id")
    amount: str = Field(max_length=32, description='credits, e.g. "100" (a negative amount debits)')
    memo: str = Field(min_length=1, max_length=200, description="why: shown in the ledger")
    idempotency_key: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_-]{16,64}$",
        description="a key of the caller's making (the CLI sends a fresh UUID per command): a retried POST "
        "with it credits once",
    )


class CreditOut(BaseModel):
    account: str
    account_id: str
    amount: Credits
    balance: Credits
    key: str


@router.post("/credits")
def credit(body: CreditIn, session: Db, principal: Principal) -> CreditOut:
    """Credit or debit an account by hand (admins of the root account): one `adjustment` entry."""
    principal.require(Action.MANAGE_ACCOUNTS)
    name, account_id = _ledger_accounts(session, principal, body.account)
    amount = prices.parse_credits(body.amount, "amount")
    entry = ledger.adjust(
        session, account_id, amount, body.memo, actor=principal.actor, idempotency_key=body.idempotency_key
    )
    return CreditOut(
        account=name,
        account_id=account_id,
        amount=amount,
        balance=ledger.balance(session, account_id),
        key=entry.key,
    )
