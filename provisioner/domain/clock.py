"""The one clock billing reads (metering ticks, device days, the 24-hour transfer of earned credits).

Services take `now` as an argument; the reconciler asks `CLOCK.now()`. Tests replace it with a
`ManualClock` to walk through hours and days without sleeping. Always timezone-aware UTC: a day of
billing is a UTC calendar day and a month's length comes from the calendar (28–31 days)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests, `provision lab` demos)."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start, e.g. datetime(..., tzinfo=UTC)")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now

    def set(self, when: datetime) -> datetime:
        self._now = when.astimezone(UTC)
        return self._now


# the process's clock; tests swap it (`clock.CLOCK = ManualClock(...)`) and restore it
CLOCK: Clock = SystemClock()


def now() -> datetime:
    return CLOCK.now()
