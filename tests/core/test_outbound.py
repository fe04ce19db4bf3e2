"""The outbound guard (apps/core/outbound.py): the address rules and the allow-list as pure functions,
then the connection layer against real servers on loopback addresses.

No test sends anything past loopback: `loopback_only` fails a test that tries, public addresses appear
only in a resolver the test controls and reach a recording backend that never connects.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import anyio
import httpcore
import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.core import outbound
from apps.core.errors import InvalidInput
from apps.core.outbound import (
    AllowList,
    GuardedBackend,
    GuardedTransport,
    OutboundRefused,
    address_refusal,
    destination_refusal,
    guarded_async_client,
    guarded_client,
    header_refusal,
    parse_allow_list,
    without_credentials,
)
from tests.support.outbound import ConnectionRecorder, FakeResolver, RecordingHTTPServer, loopback_only

PUBLIC = "93.184.215.14"
"""A public address that only ever appears in FakeResolver answers: nothing connects to it."""

LOOPBACK = "a loopback address"
PRIVATE = "a private (RFC 1918) address"
METADATA = "a cloud metadata address"


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


@pytest.fixture(autouse=True)
def _no_allow_list(settings) -> None:
    settings.OUTBOUND_ALLOW = []


# --- address rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),  # NAT64 (DNS64) form of a public IPv4 address
        ("2002:808:808::1", None),
        ("127.0.0.1", LOOPBACK),
        ("127.8.9.10", LOOPBACK),
        ("::1", LOOPBACK),
        ("10.0.0.1", PRIVATE),
        ("172.16.5.4", PRIVATE),
        ("192.168.1.1", PRIVATE),
        ("169.254.169.254", METADATA),
        ("169.254.170.2", METADATA),
        ("fd00:ec2::254", METADATA),
        ("100.100.100.200", METADATA),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("fe80::1%eth0", "a link-local address"),
        ("100.64.0.1", "a shared (CGNAT) address"),
        ("100.127.255.254", "a shared (CGNAT) address"),
        ("fc00::1", "a unique local IPv6 address"),
        ("fd12:3456::1", "a unique local IPv6 address"),
        ("0.0.0.0", "the unspecified address"),
        ("::", "the unspecified address"),
        ("224.0.0.251", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("192.0.2.10", "not a public address"),
        ("198.18.0.1", "not a public address"),
        ("::ffff:127.0.0.1", f"{LOOPBACK} (IPv4-mapped)"),
        ("::ffff:10.0.0.1", f"{PRIVATE} (IPv4-mapped)"),
        ("::ffff:169.254.169.254", METADATA),
        ("::127.0.0.1", "an IPv4-compatible IPv6 address (deprecated, never public)"),
        ("::8.8.8.8", "an IPv4-compatible IPv6 address (deprecated, never public)"),
        ("64:ff9b::a9fe:a9fe", METADATA),
        ("64:ff9b::a00:1", f"{PRIVATE} (NAT64)"),
        ("2002:a00:1::1", f"{PRIVATE} (6to4)"),
        ("2002:7f00:1::1", f"{LOOPBACK} (6to4)"),
    ],
)
def test_address_refusal(address: str, reason: str | None) -> None:
    assert address_refusal(address) == reason


# --- the allow-list ---------------------------------------------------------------------------------------


def test_allow_list_entries_parse() -> None:
    allow = parse_allow_list("10.0.0.0/8, 127.0.0.1:11434,[::1]:8080, 192.168.1.5, gpu-box, Ollama:11434")

    assert allow.allows_address(ipaddress.ip_address("10.9.9.9"), 1)
    assert allow.allows_address(ipaddress.ip_address("127.0.0.1"), 11434)
    assert not allow.allows_address(ipaddress.ip_address("127.0.0.1"), 11435)
    assert allow.allows_address(ipaddress.ip_address("::ffff:127.0.0.1"), 11434)
    assert allow.allows_address(ipaddress.ip_address("::1"), 8080)
    assert allow.allows_address(ipaddress.ip_address("192.168.1.5"), 443)
    assert not allow.allows_address(ipaddress.ip_address("192.168.1.6"), 443)
    assert allow.allows_host("GPU-box.", 1234)
    assert allow.allows_host("ollama", 11434)
    assert not allow.allows_host("ollama", 80)
    assert parse_allow_list(["127.0.0.1:11434"]) == parse_allow_list("127.0.0.1:11434")
    assert parse_allow_list("") == AllowList()


@pytest.mark.parametrize("entry", ["foo bar", "10.0.0.0/33", "host:99999", "[::1", "127.0.0.1:x", ":80"])
def test_a_bad_allow_list_entry_is_refused_with_its_text(entry: str) -> None:
    with pytest.raises(ValueError, match="OUTBOUND_ALLOW entry"):
        parse_allow_list(entry)


def test_one_non_public_address_among_public_ones_refuses_the_host() -> None:
    refusal = destination_refusal("api.example", 443, [PUBLIC, "10.1.2.3"], AllowList())

    assert refusal == f"api.example resolves to {PRIVATE}"
    assert "10.1.2.3" not in refusal  # what an internal name resolves to is not the tenant's to learn
    assert destination_refusal("api.example", 443, [PUBLIC], AllowList()) is None
    assert destination_refusal("10.1.2.3", 443, ["10.1.2.3"], AllowList()) == f"10.1.2.3 is {PRIVATE}"


def test_an_address_entry_opens_its_port_only_and_a_host_entry_opens_the_name() -> None:
    allow = parse_allow_list("127.0.0.1:11434,gpu-box")

    assert destination_refusal("127.0.0.1", 11434, ["127.0.0.1"], allow) is None
    assert destination_refusal("127.0.0.1", 22, ["127.0.0.1"], allow) == f"127.0.0.1 is {LOOPBACK}"
    assert destination_refusal("localhost", 11434, ["127.0.0.1", "::1"], allow) == (
        f"localhost resolves to {LOOPBACK}"  # ::1:11434 is not allowed
    )
    assert destination_refusal("gpu-box", 8000, ["10.0.0.7", "fd00::7"], allow) is None


def test_nothing_opens_a_metadata_address() -> None:
    allow = parse_allow_list("0.0.0.0/0,::/0,metadata.google.internal")

    assert destination_refusal("metadata.google.internal", 80, ["169.254.169.254"], allow) == (
        f"metadata.google.internal resolves to {METADATA}"
    )
    assert destination_refusal("::ffff:169.254.169.254", 80, ["::ffff:169.254.169.254"], allow) == (
        f"::ffff:169.254.169.254 is {METADATA}"
    )
    assert destination_refusal("10.0.0.1", 80, ["10.0.0.1"], allow) is None


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("Metadata-Flavor", True),
        ("metadata", True),
        ("X-aws-ec2-metadata-token", True),
        ("X-aws-ec2-metadata-token-ttl-seconds", True),
        ("X-Google-Metadata-Request", True),
        ("Host", True),
        ("Connection", True),
        ("Keep-Alive", True),
        ("Proxy-Authorization", True),
        ("TE", True),
        ("Trailer", True),
        ("Transfer-Encoding", True),
        ("Upgrade", True),
        ("Content-Length", True),
        ("X-Team\r\nHost", True),
        ("Authorization", False),
        ("X-Api-Key", False),
    ],
)
def test_header_refusal(name: str, refused: bool) -> None:
    assert (header_refusal(name) is not None) is refused


def test_without_credentials() -> None:
    assert (
        without_credentials("https://user:secret@llm.example:8443/v1?x=1")
        == "https://llm.example:8443/v1?x=1"
    )
    assert without_credentials("https://llm.example/v1") == "https://llm.example/v1"


# --- check_url: when a URL is stored ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", f"169.254.169.254 is {METADATA}"),
        ("http://127.0.0.1:8283/", f"127.0.0.1 is {LOOPBACK}"),
        ("http://[::1]:8283/", f"::1 is {LOOPBACK}"),
        ("http://localhost:8283/", f"localhost resolves to {LOOPBACK}"),
        ("http://internal.test/v1", f"internal.test resolves to {PRIVATE}"),
    ],
)
def test_check_url_refuses_with_the_reason(monkeypatch: pytest.MonkeyPatch, url: str, reason: str) -> None:
    resolver = FakeResolver({"internal.test": ["10.1.2.3"], "localhost": ["127.0.0.1"]})
    monkeypatch.setattr(outbound, "resolve", resolver)

    with pytest.raises(OutboundRefused) as refused:
        outbound.check_url(url, what="The base URL")

    assert isinstance(refused.value, InvalidInput)
    assert refused.value.message.startswith(f"The base URL is not allowed: {reason}.")
    assert "OUTBOUND_ALLOW" in refused.value.message


def test_check_url_accepts_public_allowed_and_unresolvable_hosts(monkeypatch, settings) -> None:
    monkeypatch.setattr(outbound, "resolve", FakeResolver({"api.example": [PUBLIC], "gpu-box": ["10.0.0.7"]}))
    settings.OUTBOUND_ALLOW = ["127.0.0.1:11434", "gpu-box"]

    for url in (
        "https://api.example/v1",
        "http://127.0.0.1:11434",
        "http://gpu-box:8000/v1",
        "http://not-yet.example/v1",  # decided when it is called
    ):
        outbound.check_url(url)


def test_a_bad_allow_list_setting_is_an_operator_error_not_an_open_door(settings) -> None:
    settings.OUTBOUND_ALLOW = ["127.0.0.1:11434", "10.0.0.0/40"]

    with pytest.raises(ImproperlyConfigured, match=r"'10\.0\.0\.0/40'"):
        outbound.check_url("http://127.0.0.1:11434/v1")


# --- the connection layer: real servers on loopback -------------------------------------------------------


@pytest.mark.parametrize(
    ("bind", "host"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("127.0.0.1", "localhost")]
)
def test_a_guarded_client_refuses_loopback_before_connecting(bind: str, host: str) -> None:
    with (
        ConnectionRecorder(bind) as platform,
        guarded_client() as client,
        pytest.raises(OutboundRefused, match="is not allowed"),
    ):
        client.post(f"http://{host}:{platform.port}/v1/chat/completions", content=b"{}")

    assert platform.connections == []


def test_the_allow_list_opens_exactly_its_address_and_port(settings) -> None:
    with RecordingHTTPServer() as allowed, ConnectionRecorder() as other, guarded_client() as client:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]

        answered = client.post(f"{allowed.url}/v1/chat/completions", content=b"{}")
        with pytest.raises(OutboundRefused):
            client.get(other.url)

    assert answered.status_code == 200
    assert len(allowed.requests) == 1
    assert other.connections == []


class RecordingBackend(httpcore.NetworkBackend):
    """Records where a connection would go, and the TLS server name, without connecting anywhere."""

    def __init__(self) -> None:
        self.connects: list[tuple[str, int]] = []
        self.server_names: list[str | None] = []

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, **kwargs: Any) -> Any:
        self.connects.append((host, port))
        backend = self

        class Stream(httpcore.NetworkStream):
            def start_tls(
                self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
            ) -> Any:
                backend.server_names.append(server_hostname)
                raise httpcore.ConnectError("recorded, not connected")

            def close(self) -> None:
                pass

        return Stream()


def test_dns_rebinding_cannot_reach_loopback_the_checked_address_is_the_one_connected_to() -> None:
    resolver = FakeResolver({"rebind.example": [[PUBLIC], ["127.0.0.1"]]})
    recorder = RecordingBackend()
    transport = GuardedTransport(backend=GuardedBackend(inner=recorder, resolver=resolver))

    with guarded_client(transport=transport) as client:
        with pytest.raises(httpx.ConnectError):
            client.get("https://rebind.example/v1/models")
        first = (list(resolver.lookups), list(recorder.connects), list(recorder.server_names))
        with pytest.raises(OutboundRefused, match=r"rebind\.example resolves to a loopback address"):
            client.get("https://rebind.example/v1/models")

    # One lookup per connection; the connection went to the address that was checked, and TLS still
    # verifies the URL's host name.
    assert first == ([("rebind.example", 443)], [(PUBLIC, 443)], ["rebind.example"])
    assert resolver.lookups == [("rebind.example", 443), ("rebind.example", 443)]
    assert recorder.connects == [(PUBLIC, 443)]  # the second answer (loopback) was never connected to


def test_an_unresolvable_name_is_a_connection_error_not_a_lookup_elsewhere() -> None:
    recorder = RecordingBackend()
    transport = GuardedTransport(backend=GuardedBackend(inner=recorder, resolver=FakeResolver({})))

    with guarded_client(transport=transport) as client, pytest.raises(httpx.ConnectError):
        client.get("https://nowhere.example/")

    assert recorder.connects == []


def test_a_redirect_is_not_followed_and_a_followed_one_would_be_checked_again(settings) -> None:
    with ConnectionRecorder("127.0.0.1") as platform:
        location = f"http://127.0.0.1:{platform.port}/internal"

        def redirect(*args: Any) -> tuple[int, dict[str, str], bytes]:
            return 307, {"Location": location}, b"attacker body"

        with RecordingHTTPServer("127.0.0.2", reply=redirect) as attacker, guarded_client() as client:
            settings.OUTBOUND_ALLOW = [f"127.0.0.2:{attacker.port}"]
            answered = client.post(f"{attacker.url}/v1/chat/completions", content=b"{}")
            with pytest.raises(OutboundRefused):
                client.post(f"{attacker.url}/v1/chat/completions", content=b"{}", follow_redirects=True)

    assert answered.status_code == 307
    assert platform.connections == []


def test_a_guarded_client_keeps_no_cookies(settings) -> None:
    def set_cookie(*args: Any) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Set-Cookie": "session=org-a-secret; Path=/"}, b"{}"

    with RecordingHTTPServer(reply=set_cookie) as server, guarded_client() as client:
        settings.OUTBOUND_ALLOW = ["127.0.0.1"]
        client.get(f"{server.url}/one")
        client.get(f"{server.url}/two")

        assert len(client.cookies.jar) == 0
    assert server.cookies_seen() == []


def test_the_async_client_of_mcp_is_guarded_too(settings) -> None:
    async def get(url: str) -> int:
        async with guarded_async_client() as client:
            return (await client.get(url)).status_code

    with ConnectionRecorder() as platform, RecordingHTTPServer() as allowed:
        with pytest.raises(OutboundRefused):
            anyio.run(get, platform.url)
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]
        status = anyio.run(get, f"{allowed.url}/mcp")

    assert platform.connections == []
    assert status == 200


def test_the_fence_of_these_tests_holds() -> None:
    """The tests above rely on loopback_only: a real lookup of another name fails before any query."""
    with pytest.raises(AssertionError, match="lookup attempted"):
        socket.getaddrinfo("example.com", 443)
