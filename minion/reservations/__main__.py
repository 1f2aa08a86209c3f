"""`python -m minion.reservations`: the reservation agent as a process, and an mDNS name resolver.

    serve   --lan-address A [--upnp --igd-url U --igd-cache F --lease S]
            JSON lines on stdin → one JSON reply line each on stdout:
            {"op": "apply", "desired": [{"name":…, "hostname":…, "port":…, "protocol":"tcp",
                                         "expose_wan": false}]}   (a WAN mapping needs true and --upnp)
            {"op": "set_address", "address": "10.0.0.7"}   {"op": "renew", "ahead_s": 0}
            {"op": "status"}   {"op": "close"}
    resolve HOST --lan-address A [--until ADDRESS] [--timeout S]
            prints {"t": <CLOCK_MONOTONIC>, "addresses": [...]} each time HOST.local's answer changes;
            with --until it exits 0 once exactly ADDRESS answers (1 on timeout).

Lab nodes run `serve` inside their namespace (the heartbeat client can embed ReservationAgent directly);
`resolve` is how an operator or the lab client checks a name from a LAN peer. CLOCK_MONOTONIC is
system-wide, so timestamps from different namespaces compare directly (the benchmark relies on it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from minion.reservations.upnp import DEFAULT_LEASE_S


def serve(args: argparse.Namespace) -> int:
    from contracts.reservations import ReservationSpec
    from minion.reservations.agent import ReservationAgent

    agent = ReservationAgent(
        args.lan_address,
        upnp=args.upnp,
        igd_url=args.igd_url,
        igd_cache=Path(args.igd_cache) if args.igd_cache else None,
        lease_s=args.lease,
    )
    if args.upnp:
        agent.start_renewer()
    print(json.dumps({"ready": True, "t": time.monotonic()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg: dict[str, Any] = json.loads(line)
        op = msg.get("op")
        started = time.monotonic()
        try:
            if op == "apply":
                statuses = agent.apply([ReservationSpec.from_dict(d) for d in msg["desired"]])
            elif op == "set_address":
                statuses = agent.set_address(msg["address"])
            elif op == "renew":
                renewed = agent.renew(time.monotonic() + float(msg.get("ahead_s", 0)))
                print(json.dumps({"renewed": renewed}), flush=True)
                continue
            elif op == "status":
                statuses = agent.statuses()
            elif op == "close":
                agent.close()
                print(json.dumps({"closed": True}), flush=True)
                return 0
            else:
                print(
                    json.dumps({"error": f"unknown op {op!r}: use apply, set_address, renew, status, close"}),
                    flush=True,
                )
                continue
        except (KeyError, ValueError) as exc:
            print(json.dumps({"error": f"bad request: {exc}"}), flush=True)
            continue
        reply = {"t0": started, "t1": time.monotonic(), "statuses": [s.to_dict() for s in statuses]}
        print(json.dumps(reply), flush=True)
    agent.close()
    return 0


def resolve(args: argparse.Namespace) -> int:
    from zeroconf import AddressResolver, IPVersion, Zeroconf

    fqdn = args.host if args.host.endswith(".local.") else f"{args.host.removesuffix('.local')}.local."
    zc = Zeroconf(interfaces=[args.lan_address], ip_version=IPVersion.V4Only)
    deadline = time.monotonic() + args.timeout
    last: list[str] | None = None
    print(json.dumps({"ready": True, "t": time.monotonic()}), flush=True)
    try:
        while time.monotonic() < deadline:
            resolver = AddressResolver(fqdn)
            resolver.request(zc, 200)
            addresses = sorted(resolver.parsed_addresses())
            if addresses != last:
                last = addresses
                print(json.dumps({"t": time.monotonic(), "addresses": addresses}), flush=True)
            if args.until and addresses == [args.until]:
                return 0
            time.sleep(0.002)
    finally:
        zc.close()
    return 1 if args.until else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minion.reservations")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="run the reservation agent, driven by JSON lines on stdin")
    p.add_argument("--lan-address", required=True)
    p.add_argument("--upnp", action="store_true")
    p.add_argument("--igd-url")
    p.add_argument("--igd-cache")
    p.add_argument("--lease", type=int, default=DEFAULT_LEASE_S)
    r = sub.add_parser("resolve", help="resolve HOST.local from this host's LAN address")
    r.add_argument("host")
    r.add_argument("--lan-address", required=True)
    r.add_argument("--until")
    r.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    return serve(args) if args.cmd == "serve" else resolve(args)


if __name__ == "__main__":
    sys.exit(main())
