"""The machine's IP addresses for the console banner: what the operator types into a browser or ssh.

IPv4 comes from the SIOCGIFADDR ioctl (the primary address of each interface), IPv6 from
/proc/net/if_inet6 (global scope only: link-local addresses are useless without a zone). Loopback is
left out. Standard library only, because the banner runs on the boot console before anything else.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

from minion.hardware.hostfiles import host_path

SIOCGIFADDR = 0x8915
IPV6_SCOPE_GLOBAL = "00"


def ipv4(interface: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None  # no IPv4 address on this interface
    return socket.inet_ntoa(answer[20:24])


def ipv6_global(host_root: Path | None = None) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        lines = host_path(host_root, "/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return found  # IPv6 disabled
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[3] != IPV6_SCOPE_GLOBAL:
            continue
        address = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
        found.setdefault(fields[5], []).append(str(address))
    return found


def local_addresses(host_root: Path | None = None) -> list[tuple[str, str]]:
    """[(interface, address)] in interface order, IPv4 before IPv6, loopback excluded."""
    v6 = ipv6_global(host_root)
    result: list[tuple[str, str]] = []
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        v4 = ipv4(name)
        if v4:
            result.append((name, v4))
        result.extend((name, a) for a in v6.get(name, []))
    return result
