"""`provision billing …` (estimate, balance, ledger) and `provision price …` (list, set): credits, fees and
earnings (docs/billing.md). Amounts print without trailing zeros (1.265); --json gives the server's exact
strings at the ledger's fixed scale of 6 decimal places ("1.265000")."""

from __future__ import annotations

import csv
import sys
import uuid
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, Json, fail, group, output_options
from provisioner.cli.settings import connect

app = group("Billing: what an hour costs and earns, balances and the ledger of credits.")
price_app = group("Public GPU prices: what customers pay per GPU-hour on other accounts' regions.")


class Federated(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"


def credits_text(value: Any) -> str:
    """A decimal string as a person reads it: no trailing zeros, at least two decimals (7.50, 1.265)."""
    if value is None:
        return "-"
    d = Decimal(str(value)).normalize()
    return f"{d:.2f}" if -d.as_tuple().exponent < 2 else f"{d:f}"  # type: ignore[operator]


def _money(field: str) -> render.Column:
    return (field, field.upper().replace("_", " "), lambda row: credits_text(row.get(field)))


ESTIMATE_LINES = [
    ("price_per_gpu_hour", "public price per GPU-hour"),
    ("usage_fee_per_gpu_hour", "usage fee per GPU-hour"),
    ("price", "public price, all GPUs"),
    ("usage_fee", "usage fee, all GPUs (own capacity)"),
    ("federated_fee", "federated fee per worker"),
    ("total_cost", "cost of the hour, one worker"),
    ("owner_earnings_per_gpu_hour", "region owner earns per GPU-hour"),
    ("owner_earnings", "region owner earns, all GPUs"),
]


@app.command("estimate")
@output_options
def estimate(
    gpu_type: Annotated[str | None, typer.Option("--gpu-type", help="GPU type, e.g. 'A100 40GB'.")] = None,
    gpu_count: Annotated[int, typer.Option("--gpu-count", min=0, max=64, help="GPUs per worker.")] = 1,
    public: Annotated[
        bool, typer.Option("--public", help="On another account's region (public price).")
    ] = False,
    federated: Annotated[
        Federated | None, typer.Option("--federated", help="Cross-project job of this kind: its fee.")
    ] = None,
    json_out: Json = False,
) -> None:
    """What one hour costs and earns under the billing rules, before any job runs."""
    answer = connect().get(
        "/v1/billing/estimate",
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        public=str(public).lower(),
        federated=federated.value if federated else None,
    )
    if render.machine(answer, render.chosen(json_out)):
        return
    what = (
        f"{answer['gpu_count']} x {answer['gpu_type']} ({answer['gpu_class']})"
        if answer["gpu_count"]
        else ("CPU only (no usage fee)")
    )
    where = "public capacity" if answer["public"] else "own capacity"
    print(
        f"one hour of {what} on {where}"
        + (f", federated {answer['federated']}" if answer["federated"] else "")
    )
    for field, label in ESTIMATE_LINES:
        print(f"  {label:<36} {credits_text(answer[field]):>12}")


@app.command("balance")
@output_options
def balance(
    account: Annotated[
        str | None, typer.Option("--account", help="Account name or id (default: yours).")
    ] = None,
    json_out: Json = False,
) -> None:
    """An account's balance (a sum of its ledger entries) and earnings not yet transferred."""
    answer = connect().get("/v1/billing/balance", account=account)
    if render.machine(answer, render.chosen(json_out)):
        return
    render.detail(
        {
            **answer,
            "balance": credits_text(answer["balance"]),
            "earned_pending": credits_text(answer["earned_pending"]),
        },
        fields=["account", "balance", "earned_pending", "can_start_public_jobs", "as_of"],
    )


LEDGER_COLUMNS: list[render.Column] = [
    ("at", "AT"),
    ("rule", "RULE"),
    ("payer", "FROM"),
    ("payee", "TO"),
    ("amount", "AMOUNT", lambda row: credits_text(row.get("amount"))),
    ("quantity", "QTY", lambda row: credits_text(row.get("quantity"))),
    ("job_id", "JOB"),
    ("hour", "HOUR"),
    ("day", "DAY"),
]
LEDGER_WIDE: list[render.Column] = [("worker", "WORKER"), ("gpu_type", "GPU TYPE"), ("region_id", "REGION")]


@app.command("ledger")
@output_options
def ledger(
    account: Annotated[
        str | None, typer.Option("--account", help="Account name or id (default: yours).")
    ] = None,
    since: Annotated[
        datetime | None,
        typer.Option("--since", help="Only entries at or after this time (UTC), e.g. 2026-11-01."),
    ] = None,
    job: Annotated[str | None, typer.Option("--job", help="Only the entries of this job id.")] = None,
    json_out: Json = False,
) -> None:
    """An account's ledger entries, newest first: every charge, earning and transfer."""
    answer = connect().get(
        "/v1/billing/ledger", account=account, since=since.isoformat() if since else None, job=job
    )
    render.table(answer["items"], LEDGER_COLUMNS, wide=LEDGER_WIDE, as_json=json_out, empty="no entries")


USAGE_COLUMNS: list[render.Column] = [
    ("job_id", "JOB"),
    ("gpu_type", "GPU TYPE"),
    ("rule", "RULE"),
    ("quantity", "QTY", lambda row: credits_text(row.get("quantity"))),
    ("paid", "PAID", lambda row: credits_text(row.get("paid"))),
    ("earned", "EARNED", lambda row: credits_text(row.get("earned"))),
]


@app.command("usage")
@output_options
def usage(
    month: Annotated[
        str | None, typer.Option("--month", help="The month, YYYY-MM (UTC), e.g. 2026-11.")
    ] = None,
    day: Annotated[
        str | None, typer.Option("--day", help="Instead of --month: one UTC day, e.g. 2026-11-17.")
    ] = None,
    account: Annotated[
        str | None, typer.Option("--account", help="Account name or id (default: yours).")
    ] = None,
    csv_out: Annotated[
        bool, typer.Option("--csv", help="Print CSV (exact amounts) instead of a table.")
    ] = False,
    json_out: Json = False,
) -> None:
    """What an account paid and earned in a month or on a day: per job, GPU type and rule (device days
    included)."""
    if (month is None) == (day is None):
        fail("give --month YYYY-MM or --day YYYY-MM-DD (one of them)", exit_code=EXIT_USAGE)
    rows = connect().get("/v1/billing/usage", month=month, day=day, account=account)["items"]
    if csv_out:
        out = csv.writer(sys.stdout, lineterminator="\n")
        fields = [c[0] for c in USAGE_COLUMNS]
        out.writerow(fields)
        out.writerows([[row.get(f) if row.get(f) is not None else "" for f in fields] for row in rows])
        return
    render.table(rows, USAGE_COLUMNS, as_json=json_out, empty=f"nothing paid or earned in {month or day}")


PRICE_COLUMNS: list[render.Column] = [
    ("gpu_type", "GPU TYPE"),
    ("gpu_class", "CLASS"),
    _money("price_per_gpu_hour"),
    _money("usage_fee_per_gpu_hour"),
    _money("owner_earnings_per_gpu_hour"),
    ("source", "SOURCE"),
]


@app.command("credit")
def credit(
    account: Annotated[str, typer.Argument(help="The account's name or id.")],
    amount: Annotated[str, typer.Argument(help="Credits, e.g. 100.")],
    debit: Annotated[
        bool, typer.Option("--debit", help="Take the credits from the account instead.")
    ] = False,
    memo: Annotated[str, typer.Option("--memo", help="Why: shown in the ledger.")] = "top-up",
    json_out: Json = False,
) -> None:
    """Credit (or --debit) an account by hand: a top-up, a correction (admins of the root account)."""
    signed = f"-{amount}" if debit else amount
    # one key per command: the client's retries of this POST credit once
    body = {"account": account, "amount": signed, "memo": memo, "idempotency_key": uuid.uuid4().hex}
    answer = connect().post("/v1/billing/credits", body)
    if render.machine(answer, render.chosen(json_out)):
        return
    print(answer["key"])
    print(
        f"{answer['account']}: {credits_text(answer['amount'])} credits; "
        f"balance now {credits_text(answer['balance'])}"
    )


@price_app.command("list")
@output_options
def price_list(json_out: Json = False) -> None:
    """Every GPU type's public price per GPU-hour, its usage fee and what its region owner earns."""
    render.table(connect().get("/v1/billing/prices")["items"], PRICE_COLUMNS, as_json=json_out)


@price_app.command("set")
def price_set(
    gpu_type: Annotated[str, typer.Argument(help="GPU type, e.g. 'A100 40GB'.")],
    price: Annotated[str, typer.Argument(help="Credits per GPU-hour, e.g. 2.78.")],
    json_out: Json = False,
) -> None:
    """Set a GPU type's public price (admins of the root account). Jobs keep the price they locked."""
    answer = connect().post("/v1/billing/prices", {"gpu_type": gpu_type, "price": price})
    if render.machine(answer, render.chosen(json_out)):
        return
    print(
        f"{answer['gpu_type']}: {credits_text(answer['price_per_gpu_hour'])} credits per GPU-hour; "
        f"its region owner earns {credits_text(answer['owner_earnings_per_gpu_hour'])}"
    )
