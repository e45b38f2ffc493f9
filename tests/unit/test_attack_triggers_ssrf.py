"""Attacks on the notification SSRF policy (`flowtide.notify.ssrf`): spellings of this
machine's loopback and of link-local addresses that a playbook author may write in a
`notify:` URL. Nothing here resolves a public name."""

from __future__ import annotations

import http.server
import ipaddress
import threading
from collections.abc import Iterator

import pytest

from flowtide.notify.ssrf import Refused, TargetPolicy
from flowtide.notify.targets import Sender

# IPv6 spellings of IPv4 addresses: a socket connecting to an IPv4-mapped address reaches
# the IPv4 host (Linux, dual stack), so each must be judged by the IPv4 address inside.
EMBEDDED = [
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:7f00:1",  # the same, in hex
    "::ffff:127.1.2.3",
    "::ffff:169.254.169.254",  # cloud metadata, mapped
    "::ffff:0.0.0.0",  # unspecified, mapped
    "::ffff:224.0.0.1",  # multicast, mapped
    "::127.0.0.1",  # IPv4-compatible (deprecated) loopback
    "64:ff9b::7f00:1",  # NAT64 well-known prefix
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
]


@pytest.mark.parametrize("host", EMBEDDED)
def test_ipv4_inside_ipv6_is_judged_by_its_ipv4_address(host: str) -> None:
    policy = TargetPolicy()
    with pytest.raises(Refused) as refused:
        policy.check_host(host)
    assert not refused.value.retry
    with pytest.raises(Refused):
        policy.check_url(f"http://[{host}]:8080/api/executions")


def test_an_allowed_ipv4_network_allows_its_mapped_spelling() -> None:
    policy = TargetPolicy.from_setting("127.0.0.0/8")
    policy.check_host("::ffff:127.0.0.1")
    policy.check_host("127.0.0.1")


def test_public_ipv6_and_mapped_public_ipv4_pass() -> None:
    policy = TargetPolicy()
    policy.check_host("2001:db8::1")
    policy.check_host("::ffff:192.0.2.10")
    policy.check_host("192.0.2.10")


# Spellings that only resolve locally (inet_aton forms, /etc/hosts names): these held.
HELD = [
    "127.0.0.1",
    "127.1",
    "2130706433",  # decimal
    "0x7f000001",  # hex
    "0177.0.0.1",  # octal
    "0",  # 0.0.0.0
    "0.0.0.0",
    "localhost",
    "LOCALHOST",
    "localhost.",
    "::1",
    "::",
    "[::1]",
    "169.254.169.254",
    "fe80::1",
    "fe80::1%lo",
    "224.0.0.1",
]


@pytest.mark.parametrize("host", HELD)
def test_local_spellings_of_loopback_are_refused(host: str) -> None:
    with pytest.raises(Refused):
        TargetPolicy().check_host(host)


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433:9/x",
        "http://127.1:9/x",
        "http://LOCALHOST:9/x",
        "http://[::]:9/x",
        "http://[::ffff:127.0.0.1]:9/x",
        "http://allowed.test\\@127.0.0.1:9/x",  # the host httpx connects to is checked
        "http://allowed.test%00@127.0.0.1:9/x",
        "file:///etc/passwd",
        "gopher://127.0.0.1:9/x",
        "http:///x",
    ],
)
def test_urls_that_reach_loopback_or_are_not_http_are_refused(url: str) -> None:
    with pytest.raises(Refused):
        TargetPolicy.from_setting("allowed.test").check_url(url)


@pytest.fixture
def stub() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on 127.0.0.1 (what an attacker wants reached) recording requests."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_webhook_to_mapped_loopback_never_reaches_the_server(
    stub: tuple[int, list[str]],
) -> None:
    port, seen = stub
    sender = Sender(TargetPolicy(), timeout=2.0)
    got = sender.send("webhook", {"url": f"http://[::ffff:127.0.0.1]:{port}/api/admin"}, {"x": 1})
    assert not got.ok and "refused" in (got.error or "") and not got.retry
    assert seen == []


def test_a_redirect_to_a_refused_address_is_not_followed() -> None:
    # The allowed target answers 307 to the metadata address: the POST stops there.
    seen: list[str] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.path)
            self.send_response(307)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        sender = Sender(TargetPolicy.from_setting("127.0.0.1/32"), timeout=2.0)
        got = sender.send("webhook", {"url": f"http://127.0.0.1:{port}/hook"}, {"x": 1})
    finally:
        server.shutdown()
        server.server_close()
    assert not got.ok and got.status_code == 307
    assert seen == ["/hook"]


def _sending_address() -> str | None:
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect(("192.0.2.1", 9))  # a route lookup: nothing is sent
            return str(udp.getsockname()[0])
    except OSError:
        return None


def test_every_address_of_this_machine_is_its_own() -> None:
    # The relay's own addresses were its host name's (often 127.0.x.1 only): a server on
    # 0.0.0.0 was reachable at its interface address (http://10.0.0.5:8080/api/...).
    from flowtide.notify.ssrf import machine_addresses, own_addresses

    own = own_addresses([])
    assert machine_addresses() <= own
    sending = _sending_address()
    if sending is None or sending.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    assert ipaddress.ip_address(sending) in own
    policy = TargetPolicy(own=own)
    with pytest.raises(Refused) as refused:
        policy.check_url(f"http://{sending}:8080/api/executions")
    assert "own address" in str(refused.value)
    # An operator may still allow it.
    TargetPolicy.from_setting(f"{sending}/32", own).check_host(sending)


@pytest.mark.parametrize(
    "host", ["fd00:ec2::254", "[fd00:ec2::254]", "100.100.100.200", "::ffff:100.100.100.200"]
)
def test_cloud_metadata_outside_link_local_is_refused(host: str) -> None:
    # AWS's IMDS over IPv6 is fd00:ec2::254 (not link-local); Alibaba's is 100.100.100.200.
    with pytest.raises(Refused) as refused:
        TargetPolicy().check_host(host)
    assert "metadata" in str(refused.value)
    TargetPolicy.from_setting("100.100.100.200, fd00:ec2::254").check_host(host)
