"""The outbound guard: what HTTP calls to a URL a tenant chose may reach.

Tenants choose URLs (an LLM provider's base URL, an MCP server), and the platform's processes call them
from inside the deployment's network. Without a guard such a URL reaches the cloud metadata service,
the platform's own ports and every private host (SSRF). The rules:

* **Public addresses only.** A host is refused when ANY address it resolves to is not public
  (`address_refusal`: loopback, private, link-local, CGNAT, unique-local, multicast, reserved, the
  IPv4-mapped, -compatible, NAT64 and 6to4 forms of those, and the cloud metadata addresses by name).
* **The operator's allow-list** (setting OUTBOUND_ALLOW: CIDRs, `ip[:port]`, `host[:port]`) opens
  private model servers on purpose, e.g. `OUTBOUND_ALLOW=127.0.0.1:11434` for Ollama on the same host.
  Metadata addresses stay refused whatever it says.
* **Checked where the connection is made.** `GuardedBackend` / `GuardedAsyncBackend` sit under httpcore:
  they resolve the host once, check every address, then connect to exactly those addresses, so there is
  no second lookup a rebinding DNS server could answer differently. TLS still verifies the URL's host
  name (httpcore passes it as SNI and for the certificate check).
* **No redirects, no cookies.** Guarded clients never follow a redirect (a 3xx is an error; a followed
  one would be checked again anyway) and keep no cookies, so one organisation's provider cookies never
  ride along with another organisation's requests through the shared client.
* **No metadata or hop-by-hop headers** in tenant-chosen headers (`check_headers`).

`check_url` and `check_headers` are for the moment a URL is stored (a 400 with the reason); the
transports are what make it hold at call time. URLs the deployment itself configures (settings) are
trusted and do not come through here.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpcore
import httpcore2
import httpx
import httpx2
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.core.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "fd00:ec2::254",  # AWS over IPv6
        "fd00:ec2::23",
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
    )
)
"""Cloud metadata services: refused even when the allow-list covers them."""

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

FORBIDDEN_HEADERS = frozenset(
    {
        "metadata-flavor",
        "metadata",
        "x-google-metadata-request",
        "host",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
FORBIDDEN_HEADER_PREFIXES = ("proxy-", "x-aws-ec2-metadata-token")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

ALLOW_SETTING = "OUTBOUND_ALLOW"
_LIMITS = {"max_connections": 100, "max_keepalive_connections": 20, "keepalive_expiry": 5.0}


class OutboundRefused(InvalidInput):
    """A tenant-chosen URL or header the guard will not send to. Raised before anything is connected;
    `message` says why and is safe to show the tenant (it names only what the tenant gave)."""

    code = "outbound_refused"


# --- the rules (pure) --------------------------------------------------------------------------------------


def address_refusal(address: str | IPAddress) -> str | None:
    """Why a tenant URL may not reach `address` ("a loopback address", ...), or None for a public one.

    IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4) are judged by that address too: the
    packet may end up there. IPv4-compatible addresses (deprecated) are refused outright.
    """
    ip = _plain(address)
    if is_metadata(ip):
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded, form = _embedded_ipv4(ip)
        inner = address_refusal(embedded) if embedded is not None else None
        if inner is not None:
            return f"{inner} ({form})"
        if form in ("IPv4-mapped", "NAT64") and embedded is not None:
            return None  # a public IPv4 host, reached through its mapped or DNS64-synthesised form
        if ip in _IPV4_COMPATIBLE and not (ip.is_loopback or ip.is_unspecified):
            return "an IPv4-compatible IPv6 address (deprecated, never public)"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address):
        if ip in _CGNAT:
            return "a shared (CGNAT) address"
        if any(ip in network for network in _RFC1918):
            return "a private (RFC 1918) address"
    elif ip in _UNIQUE_LOCAL:
        return "a unique local IPv6 address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "not a public address"
    return None


def is_metadata(address: str | IPAddress) -> bool:
    """A cloud metadata address, also in an IPv6 form that carries it."""
    ip = _plain(address)
    embedded = _embedded_ipv4(ip)[0] if isinstance(ip, ipaddress.IPv6Address) else None
    return ip in METADATA_ADDRESSES or embedded in METADATA_ADDRESSES


def _plain(address: str | IPAddress) -> IPAddress:
    """The address without an IPv6 zone (`fe80::1%eth0`), which changes nothing about where it is."""
    text = address if isinstance(address, str) else str(address)
    return ipaddress.ip_address(text.split("%", 1)[0])


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address | None, str]:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    return None, ""


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One OUTBOUND_ALLOW entry: a network (any port), an address with a port, or a host name
    (optionally with a port) that is trusted whatever it resolves to."""

    network: IPNetwork | None = None
    host: str | None = None
    port: int | None = None


@dataclass(frozen=True, slots=True)
class AllowList:
    entries: tuple[AllowEntry, ...] = ()

    def allows_host(self, host: str, port: int) -> bool:
        name = _host_key(host)
        return any(e.host == name and e.port in (None, port) for e in self.entries)

    def allows_address(self, address: IPAddress, port: int) -> bool:
        ip = _unmapped(address)
        return any(
            e.network is not None
            and ip.version == e.network.version
            and ip in e.network
            and e.port in (None, port)
            for e in self.entries
        )


def parse_allow_list(value: str | Iterable[str]) -> AllowList:
    """OUTBOUND_ALLOW as an AllowList: comma-separated (or a list of) `10.0.0.0/8`, `fd00::/8`,
    `127.0.0.1`, `127.0.0.1:11434`, `[::1]:11434`, `gpu-box`, `ollama:11434`. Raises ValueError."""
    items = value.split(",") if isinstance(value, str) else value
    return AllowList(tuple(_allow_entry(item.strip()) for item in items if item and item.strip()))


def _allow_entry(text: str) -> AllowEntry:
    try:
        if "/" in text:
            return AllowEntry(network=ipaddress.ip_network(text, strict=False))
        if text.startswith("["):
            address, bracket, port = text[1:].partition("]")
            if not bracket or (port and not port.startswith(":")):
                raise ValueError("unclosed IPv6 address")
            return AllowEntry(network=ipaddress.ip_network(address), port=_port(port.removeprefix(":")))
        try:
            return AllowEntry(network=ipaddress.ip_network(text))
        except ValueError:
            pass
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
        try:
            return AllowEntry(network=ipaddress.ip_network(host), port=_port(port))
        except ValueError:
            pass
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", host) or not host.strip("."):
            raise ValueError("not a host name")
        return AllowEntry(host=_host_key(host), port=_port(port))
    except ValueError as exc:
        raise ValueError(
            f"{ALLOW_SETTING} entry '{text}' is not a CIDR, an address[:port] or a host[:port]"
        ) from exc


def _port(text: str) -> int | None:
    if not text:
        return None
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError("port out of range")
    return port


def destination_refusal(host: str, port: int, addresses: Sequence[str], allow: AllowList) -> str | None:
    """Why connecting to `host`:`port`, which resolved to `addresses`, is refused, or None to go ahead.

    Every address must be public or allowed; a host the operator named is trusted whatever it resolves
    to, except metadata addresses, which nothing opens. The reason names the address only when the
    tenant wrote it (a literal IP): what an internal name resolves to is not the tenant's to learn.
    """
    if not addresses:
        return f"{host} has no address"
    named = allow.allows_host(host, port)
    literal = _is_literal(host)
    for text in addresses:
        address = _plain(text)
        reason = address_refusal(address)
        if reason is None:
            continue
        if not is_metadata(address) and (named or allow.allows_address(address, port)):
            continue
        return f"{text} is {reason}" if literal else f"{host} resolves to {reason}"
    return None


def header_refusal(name: str) -> str | None:
    """Why a tenant may not set this request header, or None. Metadata headers are what metadata
    services demand as proof that a request is not forwarded; hop-by-hop and framing headers belong to
    the HTTP client (set by a tenant, they smuggle requests)."""
    if not _HEADER_NAME.match(name or ""):
        return f"'{name}' is not a valid header name"
    lowered = name.lower()
    if lowered in FORBIDDEN_HEADERS or lowered.startswith(FORBIDDEN_HEADER_PREFIXES):
        return f"the header '{name}' is not allowed (metadata and hop-by-hop headers are the server's to set)"
    return None


def without_credentials(url: str) -> str:
    """`url` without a `user:password@` part, for showing a URL back."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _host_key(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# --- settings and name resolution ------------------------------------------------------------------------


def allow_list() -> AllowList:
    """The operator's OUTBOUND_ALLOW, parsed (once per distinct value). Raises ImproperlyConfigured."""
    value = getattr(settings, ALLOW_SETTING, None) or ()
    return _parsed_allow_list(value if isinstance(value, str) else tuple(value))


@functools.lru_cache(maxsize=8)
def _parsed_allow_list(value: str | tuple[str, ...]) -> AllowList:
    try:
        return parse_allow_list(value)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order (an IP literal is itself). The one
    lookup of a guarded connection: what it returns is both what is checked and what is connected to.
    Raises OSError (socket.gaierror) when the name does not resolve."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    return list(
        dict.fromkeys(str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6))
    )


def check_url(url: str, *, what: str = "The URL") -> None:
    """Refuse, when it is stored, a tenant URL the guard would refuse at call time. Raises OutboundRefused.

    A host the allow-list names is accepted without a lookup; a name that does not resolve (yet) is
    accepted too, since the call-time guard decides on what it resolves to then.
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise OutboundRefused(f"{what} has an invalid port.") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused(f"{what} must be an http:// or https:// URL.")
    host, port = parts.hostname, port or (443 if parts.scheme == "https" else 80)
    allow = allow_list()
    if allow.allows_host(host, port):
        return
    try:
        addresses = [host] if _is_literal(host) else resolve(host, port)
    except OSError:
        return
    refusal = destination_refusal(host, port, addresses, allow)
    if refusal is not None:
        raise OutboundRefused(refused_message(refusal, what=what))


def refused_message(refusal: str, *, what: str = "The URL") -> str:
    return (
        f"{what} is not allowed: {refusal}. Only public addresses can be reached; the operator can "
        f"allow a private server with {ALLOW_SETTING}."
    )


def check_headers(names: Iterable[str]) -> None:
    """Refuse tenant-chosen request headers that are not theirs to set. Raises OutboundRefused."""
    for name in names:
        refusal = header_refusal(name)
        if refusal is not None:
            raise OutboundRefused(refusal[0].upper() + refusal[1:] + ".")


# --- the connection layer -----------------------------------------------------------------------------------

Resolver = Callable[[str, int], list[str]]


def _checked_addresses(host: str, port: int, resolver: Resolver | None) -> list[str]:
    try:
        addresses = (resolver or resolve)(host, port)
    except OSError as exc:
        raise httpcore.ConnectError(f"could not resolve {host}") from exc
    refusal = destination_refusal(host, port, addresses, allow_list())
    if refusal is not None:
        raise OutboundRefused(refused_message(refusal))
    return addresses


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's network backend for tenant URLs: one lookup, every address checked, then a connection
    to one of exactly those addresses (tried in order). `inner` makes the actual connection."""

    def __init__(self, *, inner: httpcore.NetworkBackend | None = None, resolver: Resolver | None = None):
        self._inner = inner or httpcore.SyncBackend()
        self._resolver = resolver

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        error: Exception | None = None
        for address in _checked_addresses(host, port, self._resolver):
            try:
                return self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error or httpcore.ConnectError(f"could not connect to {host}")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise OutboundRefused("Unix sockets are not reachable through tenant URLs.")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class GuardedAsyncBackend(httpcore2.AsyncNetworkBackend):
    """The same for httpcore2 (the MCP SDK's httpx2); the lookup runs in a worker thread."""

    def __init__(
        self, *, inner: httpcore2.AsyncNetworkBackend | None = None, resolver: Resolver | None = None
    ):
        self._inner = inner or httpcore2.AnyIOBackend()
        self._resolver = resolver

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await anyio.to_thread.run_sync(_checked_addresses, host, port, self._resolver)
        except httpcore.ConnectError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                error = exc
        raise error or httpcore2.ConnectError(f"could not connect to {host}")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise OutboundRefused("Unix sockets are not reachable through tenant URLs.")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport over a GuardedBackend (no proxies from the environment: they would be what is
    connected to, and checked, instead of the host)."""

    def __init__(self, *, verify: Any = True, backend: httpcore.NetworkBackend | None = None) -> None:
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context, network_backend=backend or GuardedBackend(), **_LIMITS
        )


class GuardedAsyncTransport(httpx2.AsyncHTTPTransport):
    """httpx2's async transport over a GuardedAsyncBackend."""

    def __init__(self, *, verify: Any = True, backend: httpcore2.AsyncNetworkBackend | None = None) -> None:
        ssl_context = httpx2.create_ssl_context(verify=verify, trust_env=False)
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context, network_backend=backend or GuardedAsyncBackend(), **_LIMITS
        )


def no_cookies() -> CookieJar:
    """A cookie jar that stores and sends nothing (for clients shared by every organisation)."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def guarded_client(*, transport: httpx.BaseTransport | None = None, **kwargs: Any) -> httpx.Client:
    """An httpx client for tenant URLs: guarded transport, no redirects, no cookies, no environment."""
    return httpx.Client(
        transport=transport or GuardedTransport(),
        follow_redirects=False,
        cookies=no_cookies(),
        trust_env=False,
        **kwargs,
    )


def guarded_async_client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """An httpx2 client for tenant URLs, with the signature of the MCP SDK's `httpx_client_factory`."""
    return httpx2.AsyncClient(
        headers=headers,
        timeout=timeout if timeout is not None else httpx2.Timeout(30.0, read=300.0),
        auth=auth,
        transport=GuardedAsyncTransport(),
        follow_redirects=False,
        cookies=no_cookies(),
        trust_env=False,
    )
