"""The mDNS publisher reads python-zeroconf internals (minion/reservations/mdns.py): private constants for
the RFC 6762 probe and the outgoing answer queues it purges after a goodbye. An upgrade that changes them
would not fail loudly there, so this test fails on any zeroconf release the netns tests have not proven,
and checks the internals' shape without opening a socket."""

from __future__ import annotations

import zeroconf
from zeroconf import const

from minion.reservations.mdns import ZEROCONF_TESTED


def test_installed_zeroconf_is_a_tested_release() -> None:
    assert zeroconf.__version__.startswith(ZEROCONF_TESTED), (
        f"zeroconf {zeroconf.__version__} is not one of {ZEROCONF_TESTED}: run "
        "tests/minion/test_mdns_netns.py and tests/minion/test_reservation_agent.py against it, "
        "then add it to ZEROCONF_TESTED and pyproject.toml"
    )


def test_private_constants_keep_their_wire_values() -> None:
    # RFC 1035 / RFC 6762 values: if zeroconf renamed or changed them, the probe would be malformed
    assert (const._CLASS_IN, const._CLASS_UNIQUE, const._TYPE_A, const._TYPE_ANY) == (1, 0x8000, 1, 255)
    assert const._FLAGS_QR_QUERY == 0 and const._DNS_HOST_TTL == 120


def test_outgoing_queue_internals_exist() -> None:
    from zeroconf._handlers.answers import AnswerGroup
    from zeroconf._handlers.multicast_outgoing_queue import MulticastOutgoingQueue

    for cls, attrs in ((MulticastOutgoingQueue, ("queue", "async_add")), (AnswerGroup, ("answers",))):
        missing = [a for a in attrs if not hasattr(cls, a)]
        assert not missing, f"zeroconf's {cls.__name__} lacks {missing}: _drop_pending_answers must change"
