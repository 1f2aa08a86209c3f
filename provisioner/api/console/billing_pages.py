"""The console's billing page: the signed-in account's balance, its ledger (newest first) and a month's
usage, read with the functions GET /v1/billing/balance, /ledger and /usage call (services/billing/ledger.py).

Whose: the signed-in account's. The root account's admins may name another account (?account=NAME), as
`provision billing … --account` does; anyone else naming another account gets the same 404 as a
missing one (services/accounts.get_visible)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.api.console.forms import SignedIn
from provisioner.api.console.render import ConsoleRoute, page, reading
from provisioner.domain import billing_rules as rules
from provisioner.domain import clock
from provisioner.services.accounts import accounts
from provisioner.services.billing import ledger
from provisioner.store.account_models import Account
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.job_models import Job

router = APIRouter(include_in_schema=False, route_class=ConsoleRoute)

LEDGER_SHOWN: Final = 200  # the newest entries; `provision billing ledger` lists more


@dataclass(frozen=True)
class LedgerLine:
    """One ledger entry as the account sees it: credits in (+) or out (-) of its balance or earnings."""

    entry: LedgerEntry
    signed: Decimal
    into_earnings: bool  # the entry moves the account's pending earnings, not its balance


def _lines(rows: list[LedgerEntry], account_id: str) -> list[LedgerLine]:
    earned = rules.earned_account(account_id)
    out = []
    for row in rows:
        amount = rules.from_micros(row.amount_micros)
        incoming = row.payee in (account_id, earned)
        # a transfer moves earnings into the balance: shown as the balance's gain
        out.append(
            LedgerLine(
                row,
                amount if incoming else -amount,
                earned in (row.payee, row.payer) and account_id not in (row.payee, row.payer),
            )
        )
    return out


def _names(session: Session, rows: list[LedgerEntry], job_ids: set[str]) -> dict[str, str]:
    """What the page shows instead of ids: job names, account names (`NAME (earned)` for an account's
    pending earnings); the platform's ledger account keeps its own name."""
    jobs = job_ids | {r.job_id for r in rows if r.job_id}
    raw = {r.payer for r in rows} | {r.payee for r in rows}
    ids = {a.removesuffix(rules.EARNED_SUFFIX) for a in raw}
    out = (
        dict(session.execute(select(Job.id, Job.name).where(Job.id.in_(jobs))).tuples().all()) if jobs else {}
    )
    accounts_by_id = dict(
        session.execute(select(Account.id, Account.name).where(Account.id.in_(ids))).tuples().all()
    )
    for account in raw:
        base = account.removesuffix(rules.EARNED_SUFFIX)
        if base in accounts_by_id:
            out[account] = accounts_by_id[base] + (" (earned)" if account != base else "")
    return out


@router.get("/billing", response_class=HTMLResponse)
def billing(request: Request, who: SignedIn) -> Response:
    wanted = request.query_params.get("account") or None
    month = request.query_params.get("month") or clock.now().strftime("%Y-%m")
    with reading(request) as session:
        account = accounts.get_visible(session, who.principal, wanted or who.principal.account_id)
        usage = ledger.usage(session, account.id, month)  # InvalidInput for a month not YYYY-MM
        value = ledger.balance(session, account.id)
        rows = ledger.entries(session, [account.id, rules.earned_account(account.id)], limit=LEDGER_SHOWN)
        return page(
            request,
            "billing.html",
            who,
            account=account,
            own=account.id == who.principal.account_id,
            others=accounts.list_visible(session, who.principal),
            balance=value,
            earned_pending=ledger.balance(session, rules.earned_account(account.id)),
            can_start_public_jobs=value > 0,
            as_of=clock.now(),
            month=month,
            usage=usage,
            usage_paid=sum((u.paid for u in usage), rules.credits(0)),
            usage_earned=sum((u.earned for u in usage), rules.credits(0)),
            ledger=_lines(rows, account.id),
            names=_names(session, rows, {u.job_id for u in usage if u.job_id}),
            ledger_shown=LEDGER_SHOWN,
        )
