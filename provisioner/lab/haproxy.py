"""HAProxy in front of several control-plane hosts: its configuration, rendered from the control plane's
own timings (docs/control-plane.md "Several hosts").

TCP mode, so TLS ends at each control-plane host and the CA a bundle pins still signs what a minion sees.
The idle timeouts are the server's keep-alive and a margin, so HAProxy never cuts a minion's connection
between two beats; health checks are verified TLS handshakes, patient with a host that is busy (a join
burst), and a connection refused by a host that died before its check noticed is sent to another
(`retries` + `option redispatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jinja2 import Environment, StrictUndefined

from provisioner.api.tuning import keep_alive_s

_TEMPLATE = """\
global
    log stdout format raw local0 info
{%- if admin_socket %}
    stats socket {{ admin_socket }} mode 600 level admin
{%- endif %}

defaults
    mode tcp
    option tcplog
    log global
    timeout connect 1s
    # a minion's connection lives from beat to beat: longer than the control plane keeps it idle
    timeout client {{ idle_s }}s
    timeout server {{ idle_s }}s
    retries 2
    option redispatch
    # a busy host answers a check's TLS handshake late, not never: with 200 ms checks HAProxy closed a
    # fifth of a burst of joins' connections, with these none (a dead host is skipped at once anyway:
    # its refusals are retried on another host)
    timeout check 3s

frontend control_plane
    bind {{ listen }}
{%- for extra in also_listen %}
    bind {{ extra }}
{%- endfor %}
    default_backend control_plane_hosts

backend control_plane_hosts
    balance roundrobin
    default-server check inter 1s fastinter 200ms fall 3 rise 2 \
check-ssl verify required ca-file {{ ca_file }} verifyhost {{ check_name }}
{%- for server in servers %}
    server cp{{ loop.index }} {{ server }}
{%- endfor %}
"""


@dataclass(frozen=True)
class HaproxyConfig:
    """`listen`: ADDRESS:PORT the minions and operators dial; `servers`: each control-plane host's
    ADDRESS:PORT; `ca_file`: the control plane's CA (the checks verify each host's certificate, issued
    for `check_name`, the name or address the bundles carry); `also_listen`: more addresses, e.g. the lab's
    `fd@N`, a socket made in another network namespace and inherited."""

    listen: str
    servers: Sequence[str]
    ca_file: str
    check_name: str
    heartbeat_s: float = 30.0
    admin_socket: str | None = None
    also_listen: Sequence[str] = ()

    def render(self) -> str:
        if not self.servers:
            raise ValueError("HAProxy needs at least one control-plane host (--server ADDRESS:PORT)")
        env = Environment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
        return env.from_string(_TEMPLATE).render(
            listen=self.listen,
            servers=list(self.servers),
            ca_file=self.ca_file,
            check_name=self.check_name,
            idle_s=keep_alive_s(self.heartbeat_s) + 15,
            admin_socket=self.admin_socket,
            also_listen=list(self.also_listen),
        )
