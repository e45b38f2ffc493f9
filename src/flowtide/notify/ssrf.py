"""Where a notification may go: never, unless an operator allowed it, to this machine's
loopback, a link-local address (cloud metadata services live there; AWS's IPv6 one and
Alibaba's, which do not, are refused by address), an unspecified or multicast address,
or one of this server's own addresses (its listen and advertised hosts', and every
interface's: a server on 0.0.0.0 answers on each). Otherwise a playbook author could
make the server call its own admin routes (`POST /api/...` on 127.0.0.1) or a metadata
endpoint with a notification. Operators allow hosts or CIDRs with
FLOWTIDE_NOTIFY_ALLOW_HOSTS (tests allow their loopback stubs this way).

An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:127.0.0.1`, which a socket
connects to the IPv4 host; IPv4-compatible `::127.0.0.1`; NAT64 `64:ff9b::/96`; 6to4
`2002::/16`) is judged by that IPv4 address as well.

Every address a name resolves to is checked; the connection may still resolve it again
(a DNS answer that changes between the check and the connect is not caught: allow-list
or firewall egress where that matters).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from flowtide.errors import FlowtideError

__all__ = ["Refused", "TargetPolicy", "machine_addresses", "own_addresses"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refused(FlowtideError):
    """A notification target that the SSRF policy refuses (never retried), or whose name
    does not resolve now (`retry`: DNS may answer later)."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


def machine_addresses() -> frozenset[Address]:
    """The addresses of this machine's interfaces, as far as they can be read without
    privileges: Linux's /proc (every interface), else the address the machine sends
    from (a UDP socket connected, which sends nothing). A server listening on 0.0.0.0
    answers on each of them, whatever its host name resolves to."""
    found: set[Address] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for before, line in zip(lines, lines[1:], strict=False):
        if line.strip() == "/32 host LOCAL" and "|--" in before:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.ip_address(before.split("|--", 1)[1].strip()))
    try:
        rows = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        rows = []
    for row in rows:
        text = row.split(maxsplit=1)[0] if row.strip() else ""
        if len(text) == 32:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv6Address(int(text, 16)))
    if not found:
        for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as udp:
                    udp.connect((probe, 9))
                    found.add(ipaddress.ip_address(udp.getsockname()[0].split("%")[0]))
            except (OSError, ValueError):
                continue
    return frozenset(a for a in found if not a.is_unspecified)


def own_addresses(hosts: Iterable[str], *, machine: bool = True) -> frozenset[Address]:
    """The addresses `hosts` (this server's listen and advertised hosts) resolve to, and
    (`machine`) those of this machine's interfaces."""
    found: set[Address] = set(machine_addresses()) if machine else set()
    for host in hosts:
        if not host:
            continue
        try:
            found.add(ipaddress.ip_address(host))
            continue
        except ValueError:
            pass
        try:
            for info in socket.getaddrinfo(host, None):
                found.add(ipaddress.ip_address(info[4][0]))
        except OSError:
            continue
    return frozenset(a for a in found if not a.is_unspecified)


_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")
#: Cloud metadata services outside link-local: AWS's IPv6 endpoint (a unique local
#: address) and Alibaba Cloud's (in the shared address space).
METADATA: Final = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)


def _spellings(address: Address) -> list[Address]:
    """`address` and the IPv4 address an IPv6 one carries (mapped, compatible, NAT64,
    6to4), which is where a connection to it may go."""
    found: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and (address in _NAT64 or address in _COMPATIBLE):
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            found.append(inner)
    return found


def _why(address: Address, own: frozenset[Address]) -> str | None:
    return (
        "loopback"
        if address.is_loopback
        else "link-local"
        if address.is_link_local
        else "unspecified"
        if address.is_unspecified
        else "multicast"
        if address.is_multicast
        else "a cloud metadata service"
        if address in METADATA
        else "this server's own address"
        if address in own
        else None
    )


@dataclass(frozen=True)
class TargetPolicy:
    """Which hosts a notification may reach: `allow` (host names and networks an operator
    listed) and this server's own addresses (`own`, refused unless allowed)."""

    allow_names: frozenset[str] = frozenset()
    allow_networks: tuple[Network, ...] = ()
    own: frozenset[Address] = frozenset()

    @classmethod
    def from_setting(cls, text: str | None, own: Collection[Address] = ()) -> TargetPolicy:
        names: set[str] = set()
        networks: list[Network] = []
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                names.add(item.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks), frozenset(own))

    def _allowed(self, address: Address) -> bool:
        return any(address in n for n in self.allow_networks)

    def check_host(self, host: str, port: int | None = None) -> None:
        """Refuse (`Refused`) a host that resolves to an address this policy keeps out.

        Raises:
            Refused: loopback, link-local, unspecified, multicast or this server's own
                address, not allowed by the operator; or a name that does not resolve.
        """
        name = host.lower().rstrip(".")
        if name in self.allow_names:
            return
        try:
            addresses = [ipaddress.ip_address(name.strip("[]"))]
        except ValueError:
            try:
                infos = socket.getaddrinfo(name, port)
            except OSError as exc:
                raise Refused(
                    f"{host}: does not resolve ({exc.strerror or exc})", retry=True
                ) from None
            addresses = [ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos]
        for address in addresses:
            if self._allowed(address):
                continue
            for spelled in _spellings(address):
                if spelled is not address and self._allowed(spelled):
                    continue
                why = _why(spelled, self.own)
                if why is not None:
                    raise Refused(
                        f"{host} is {why} ({spelled}): not allowed as a notification target"
                        " (an operator may allow it in FLOWTIDE_NOTIFY_ALLOW_HOSTS)"
                    )

    def check_url(self, url: str) -> None:
        """`check_host` on `url`'s host. Raises: Refused."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Refused("not an http(s) URL with a host")
        self.check_host(parts.hostname, parts.port)
