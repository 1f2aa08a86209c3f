"""A stand-in for `minion run`'s heartbeat loop, run inside a node's namespace by the tests:
each stdin line {"desired": {...}} goes through minion.desired.apply (exactly what the loop does with
a heartbeat response) and the actual state comes back as one JSON line; {"op": "close"} runs the
shutdown hooks (minion.desired.shutdown) and exits. Also reports whether zeroconf was imported before
the first reservation arrived (the handler must stay import-light)."""

from __future__ import annotations

import json
import sys
import time

from minion import desired
from minion.reservations import heartbeat as reservations


def main() -> int:
    reservations.register_handlers()
    print(json.dumps({"ready": True, "zeroconf_loaded": "zeroconf" in sys.modules}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("op") == "close":
            errors = desired.shutdown()
            print(json.dumps({"closed": not errors, "errors": errors, "t": time.monotonic()}), flush=True)
            return 0
        t0 = time.monotonic()
        actual = desired.apply(msg["desired"])
        print(
            json.dumps(
                {
                    "t0": t0,
                    "t1": time.monotonic(),
                    "actual": actual,
                    "zeroconf_loaded": "zeroconf" in sys.modules,
                }
            ),
            flush=True,
        )
    desired.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
