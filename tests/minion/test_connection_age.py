"""A minion lets each connection to the control plane go after its lifetime (minion/join/client.py
ConnectionAge), so that behind a load balancer a restarted host gets its share of the fleet back; what
that does on the wire is in tests/provisioner/test_fleet_bench_client.py and behind HAProxy in
tests/provisioner/test_scale_out.py."""

from __future__ import annotations

from bench.beat_client import Lifetimes, Target
from minion.join.client import CONNECTION_LIFETIME_S, ConnectionAge, connection_lifetime_s


def test_each_lifetime_is_drawn_within_a_quarter_of_the_mean() -> None:
    assert connection_lifetime_s(draw=lambda: 0.0) == 0.75 * CONNECTION_LIFETIME_S
    assert connection_lifetime_s(draw=lambda: 1.0) == 1.25 * CONNECTION_LIFETIME_S
    assert connection_lifetime_s(100, lambda: 0.5) == 100


def test_the_first_request_past_the_lifetime_is_the_connections_last_and_the_next_one_starts_afresh() -> None:
    now = [0.0]
    draws = iter([0.5, 1.0])  # lifetimes of 600 s, then 750 s
    age = ConnectionAge(600, clock=lambda: now[0], draw=lambda: next(draws))
    first, second = object(), object()
    assert not age.last()  # no connection yet
    age.answered(first, 0.0, closed=False)
    now[0] = 570
    assert not age.last()
    age.answered(first, 570, closed=False)
    now[0] = 600
    assert age.last()
    age.answered(first, 600, closed=True)  # it asked: the server closed it
    assert age.lifetime_s == 750 and not age.last()
    now[0] = 630
    age.answered(second, 630, closed=False)  # opened by this request
    now[0] = 630 + 720
    assert not age.last()
    now[0] = 630 + 750
    assert age.last()


def test_a_connection_that_failed_or_closed_idle_is_aged_from_its_successor() -> None:
    now = [0.0]
    age = ConnectionAge(600, clock=lambda: now[0], draw=lambda: 0.5)
    age.answered(object(), 0.0, closed=False)
    age.forget()
    now[0] = 700
    assert not age.last()  # the next request opens a new connection: it is not its last
    age.answered(object(), 700, closed=False)
    now[0] = 1000
    assert not age.last()
    # an idle connection the pool dropped: the request after it came back on another stream
    age.answered(object(), 1000, closed=False)
    now[0] = 1599
    assert not age.last()


def test_the_bench_draws_a_minions_beats_per_connection_and_starts_part_way() -> None:
    target = Target("https://cp", None, 1, lifetime_s=600, interval_s=30, partway=True)  # type: ignore[arg-type]
    firsts, laters = [], []
    for _ in range(300):
        lifetimes = Lifetimes(target)
        firsts.append(lifetimes.next())
        laters.append(lifetimes.next())
    # 450 to 750 s at 30 s: the 16th to the 26th beat is the last
    assert min(laters) >= 16 and max(laters) <= 26
    assert min(firsts) == 1 and max(firsts) > 16  # part-way through: anywhere in a life
    assert Lifetimes(Target("https://cp", None, 1, reconnect_every=1)).next() == 1  # type: ignore[arg-type]
    assert Lifetimes(Target("https://cp", None, 1)).next() == 0  # type: ignore[arg-type]
