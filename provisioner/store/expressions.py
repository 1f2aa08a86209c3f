"""SQL expressions the services build their statements from."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, false, or_


def one_of(column: Any, values: Iterable[Any]) -> ColumnElement[bool]:
    """`column IN (values)` for a fixed set known when the statement is built (states, kinds), written as
    `column = v1 OR column = v2 …`. SQLAlchemy renders an IN list's values at every execution (its
    "expanding" parameters), even in a statement built once and cached; equalities are compiled once.
    A heartbeat's first query tests three such sets on each of 333 beats a second."""
    terms = [column == v for v in values]
    return or_(*terms) if terms else false()
