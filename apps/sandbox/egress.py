"""The egress filter of network-enabled sandboxes: tenant code reaches public addresses, never a private one.

A sandbox config with `network_enabled` puts its containers on one Docker network (SANDBOX_NETWORK,
default `letta-sandbox-egress`) on a fixed Linux bridge (BRIDGE) with inter-container traffic off and
IPv6 off (Docker then disables IPv6 inside the container, so there is no IPv6 path to filter). The
host's iptables drop what comes in from that bridge:

- forwarded (chain DOCKER-USER, which Docker evaluates before its own rules): every non-public IPv4
  destination (`NON_PUBLIC_IPV4`: private, loopback, link-local and the metadata service 169.254.169.254,
  CGNAT, benchmarking, documentation, multicast, reserved), minus the CIDRs the operator allows
  (SANDBOX_EGRESS_ALLOW_CIDRS); published ports of other containers are DNATed to private addresses
  before this chain, so they are dropped too;
- addressed to the host itself (chain INPUT): everything, on any of its addresses (its API, PostgreSQL,
  Redis, the bridge gateways). No exception is needed: Docker's embedded DNS answers at 127.0.0.11
  inside the container's own network namespace and never reaches the host's INPUT. Its upstream
  queries are sent from the container's namespace too (libnetwork's resolver), so a private upstream
  resolver is dropped like any private address unless allowed.

Every rule carries the comment TAG: that is how they are checked (`iptables -S`), installed (`-C`
before `-I`, so again and again is harmless) and, when the allow list changed, removed.

Fail closed: `require_egress_filter` runs before a network-enabled call (cached per process for
SANDBOX_EGRESS_CHECK_TTL seconds, like the engine ping); if the network or the rules cannot be made
right it raises EgressUnavailable and the tool does not run, never on another network.
SANDBOX_EGRESS_FILTER="external" says the operator filters SANDBOX_NETWORK: nothing is checked.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from docker.errors import APIError, DockerException, NotFound

from apps.sandbox.docker_sandbox import LABEL, DockerUnavailable, get_client

logger = logging.getLogger(__name__)

BRIDGE = "letta-egress0"  # the Linux bridge of the egress network: what every rule matches (-i)
TAG = "letta-sandbox-egress"  # the comment on every rule this module adds
FORWARD_CHAIN = "DOCKER-USER"
INPUT_CHAIN = "INPUT"
FILTER_MODES = ("iptables", "external")
IPTABLES_TIMEOUT_SECONDS = 15.0

# Every IPv4 range that is not the public internet: the IANA special-purpose ranges, which include all
# that Python's `ipaddress` calls non-global (unit-tested), and multicast.
NON_PUBLIC_IPV4: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # carrier-grade NAT (shared address space)
    "127.0.0.0/8",  # loopback (another's: the container's own never leaves the container)
    "169.254.0.0/16",  # link-local, with the cloud metadata service 169.254.169.254
    "172.16.0.0/12",  # private: Docker's networks, this one's gateway included
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
)

_NETWORK_OPTIONS = {
    "com.docker.network.bridge.name": BRIDGE,
    "com.docker.network.bridge.enable_icc": "false",  # tools of two tenants never talk to each other
}


class EgressUnavailable(Exception):
    """The egress filter is not in place, so a network-enabled tool must not run; the message says why."""


# --- pure decisions ----------------------------------------------------------------------------------


def blocked_networks(allow: Iterable[str] = ()) -> list[ipaddress.IPv4Network]:
    """The destinations dropped from the sandbox bridge: NON_PUBLIC_IPV4 minus the `allow` CIDRs.

    Returned as disjoint, sorted networks (an allowed /32 inside 10/8 leaves the 32 pieces around it),
    so the rules are all DROPs and their order does not matter. Host bits of an allowed CIDR are
    ignored; anything that is not an IPv4 CIDR raises ValueError (IPv6 is off on the network).
    """
    holes = []
    for item in allow:
        text = item.strip()
        if not text:
            continue
        network = ipaddress.ip_network(text, strict=False)
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(f"{text!r} is not an IPv4 CIDR (the sandbox network has no IPv6)")
        holes.append(network)
    blocked = list(ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in NON_PUBLIC_IPV4))
    for hole in ipaddress.collapse_addresses(holes):
        carved: list[ipaddress.IPv4Network] = []
        for network in blocked:
            if network.subnet_of(hole):
                continue
            if hole.subnet_of(network):
                carved.extend(network.address_exclude(hole))
            else:
                carved.append(network)
        blocked = carved
    return sorted(blocked)


@dataclass(frozen=True)
class Rule:
    """One rule of ours: DROP what comes in on `bridge`, in `chain`, to `destination` (None: anything)."""

    chain: str
    bridge: str
    destination: str | None = None

    def spec(self) -> list[str]:
        """The rule's iptables arguments after the chain name (for -C, -I and -D)."""
        to = ["-d", self.destination] if self.destination else []
        return [*to, "-i", self.bridge, "-m", "comment", "--comment", TAG, "-j", "DROP"]


def filter_rules(bridge: str, blocked: Sequence[ipaddress.IPv4Network]) -> list[Rule]:
    """The whole filter: nothing from the bridge to the host itself, nothing forwarded to `blocked`."""
    return [Rule(INPUT_CHAIN, bridge), *(Rule(FORWARD_CHAIN, bridge, str(n)) for n in blocked)]


@dataclass(frozen=True)
class Listed:
    """A rule tagged with TAG as `iptables -v -S` lists it."""

    chain: str
    rule: Rule | None  # None: tagged, but not a shape this module writes (so it goes)
    spec: tuple[str, ...]  # its arguments after the chain name, without counters: what -D takes
    packets: int


def tagged_rules(listing: str) -> list[Listed]:
    """Our rules (tagged with TAG) in the output of `iptables [-v] -S CHAIN`, with their packet counts."""
    found = []
    for line in listing.splitlines():
        tokens = shlex.split(line)
        if len(tokens) < 3 or tokens[0] != "-A":
            continue
        chain, rest = tokens[1], tokens[2:]
        at = rest.index("--comment") if "--comment" in rest else -1
        if at < 0 or rest[at + 1 : at + 2] != [TAG]:
            continue
        spec: list[str] = []
        options: dict[str, str] = {}
        packets = 0
        shape_ok = True
        i = 0
        while i < len(rest):
            if rest[i] == "-c" and i + 2 < len(rest):  # -v: "-c <packets> <bytes>"
                packets = int(rest[i + 1])
                i += 3
                continue
            if i + 1 >= len(rest) or rest[i] in options or not rest[i].startswith("-"):
                shape_ok = False  # a negation ("!"), a repeated option: not ours
                spec.extend(rest[i:])
                break
            options[rest[i]] = rest[i + 1]
            spec.extend(rest[i : i + 2])
            i += 2
        rule = _our_rule(chain, options) if shape_ok else None
        found.append(Listed(chain, rule, tuple(spec), packets))
    return found


def _our_rule(chain: str, options: dict[str, str]) -> Rule | None:
    if set(options) - {"-d"} != {"-i", "-m", "--comment", "-j"}:
        return None
    if (options["-m"], options["-j"]) != ("comment", "DROP"):
        return None
    destination = options.get("-d")
    if destination is not None:
        try:
            destination = str(ipaddress.ip_network(destination, strict=False))
        except ValueError:
            return None
    return Rule(chain, options["-i"], destination)


def rule_changes(wanted: Sequence[Rule], listed: Sequence[Listed]) -> tuple[list[Rule], list[Listed]]:
    """(rules to add, listed rules to remove): what is missing, and what is stale or a duplicate."""
    wanted_set = set(wanted)
    kept: set[Rule] = set()
    extra = []
    for item in listed:
        if item.rule in wanted_set and item.rule not in kept:
            kept.add(item.rule)
        else:
            extra.append(item)
    return [rule for rule in wanted if rule not in kept], extra


def network_problems(attrs: dict[str, Any], bridge: str) -> list[str]:
    """Why an existing Docker network is not one the filter covers (empty: it is)."""
    options = attrs.get("Options") or {}
    problems = []
    if attrs.get("Driver") != "bridge":
        problems.append(f"its driver is {attrs.get('Driver')!r}, not 'bridge'")
    if options.get("com.docker.network.bridge.name") != bridge:
        problems.append(
            f"its Linux bridge is {options.get('com.docker.network.bridge.name') or 'chosen by Docker'}, "
            f"not {bridge}"
        )
    if str(options.get("com.docker.network.bridge.enable_icc", "true")).lower() not in ("false", "0", "f"):
        problems.append("its containers may talk to each other (enable_icc is not false)")
    if attrs.get("EnableIPv6"):
        problems.append("it has IPv6, which this filter does not cover")
    return problems


# --- the host: Docker network, iptables ----------------------------------------------------------------


def ensure_network(name: str) -> dict[str, Any]:
    """Create the egress network if it is missing; its attributes, or EgressUnavailable if it is not ours."""
    try:
        api = get_client().api
        try:
            attrs: dict[str, Any] = api.inspect_network(name)
        except NotFound:
            try:
                api.create_network(
                    name,
                    driver="bridge",
                    options=_NETWORK_OPTIONS,
                    labels={LABEL: "1"},
                    enable_ipv6=False,
                    check_duplicate=True,
                )
            except APIError as exc:
                if exc.status_code != 409:  # 409: another process created it meanwhile
                    raise
            attrs = api.inspect_network(name)
    except (DockerException, DockerUnavailable) as exc:
        raise EgressUnavailable(
            f"the Docker network {name!r} could not be inspected or created: {exc}"
        ) from None
    problems = network_problems(attrs, BRIDGE)
    if problems:
        raise EgressUnavailable(
            f"the Docker network {name!r} exists but is not the sandbox egress network: "
            f"{'; '.join(problems)} (remove it with `docker network rm {name}` and the server creates it "
            "as needed, or name another SANDBOX_NETWORK)"
        )
    return attrs


def _iptables(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [binary, "-w", "5", *args],
            capture_output=True,
            text=True,
            timeout=IPTABLES_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise EgressUnavailable(
            f"there is no iptables program {binary!r} (SANDBOX_EGRESS_IPTABLES)"
        ) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise EgressUnavailable(f"`{binary}` could not run: {exc}") from None


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stderr or done.stdout).splitlines() if not line.startswith("#")]
    return " ".join(lines).strip() or f"exit code {done.returncode}"


def installed_rules(chain: str, *, iptables: str = "iptables") -> list[Listed]:
    """Our rules in `chain` as the host has them, with packet counters."""
    done = _iptables(iptables, "-v", "-S", chain)
    if done.returncode != 0:
        hint = ""
        if chain == FORWARD_CHAIN:
            hint = (
                " (Docker creates DOCKER-USER when it manages iptables: is its `iptables` option off, or"
                " does this iptables use another backend, nft or legacy, than Docker's?)"
            )
        raise EgressUnavailable(f"`{iptables} -S {chain}` failed: {_failure(done)}{hint}")
    return tagged_rules(done.stdout)


def _forward_reaches_docker_user(iptables: str) -> bool:
    done = _iptables(iptables, "-S", "FORWARD")
    return done.returncode == 0 and f"-A FORWARD -j {FORWARD_CHAIN}" in done.stdout.splitlines()


def _changes(iptables: str, wanted: Sequence[Rule]) -> tuple[list[Rule], list[Listed]]:
    listed = [
        item for chain in (INPUT_CHAIN, FORWARD_CHAIN) for item in installed_rules(chain, iptables=iptables)
    ]
    return rule_changes(wanted, listed)


def install_egress_filter(*, network: str, allow: Sequence[str], iptables: str = "iptables") -> None:
    """Make the egress network and its rules right, then verify them. Idempotent; raises EgressUnavailable.

    Missing rules are added first (`-C`, then `-I` at the top of the chain), stale ones removed after,
    so a changing allow list never leaves a moment with less filtering than either list asks for.
    """
    try:
        blocked = blocked_networks(allow)
    except ValueError as exc:
        raise EgressUnavailable(f"SANDBOX_EGRESS_ALLOW_CIDRS is not a list of IPv4 CIDRs: {exc}") from None
    ensure_network(network)
    if not (Path("/sys/class/net") / BRIDGE).exists():
        raise EgressUnavailable(
            f"the bridge {BRIDGE} of the Docker network {network!r} is not in this server's network "
            "namespace, so rules installed here would not filter it (the server must run in the Docker "
            "host's network namespace)"
        )
    wanted = filter_rules(BRIDGE, blocked)
    missing, extra = _changes(iptables, wanted)
    for rule in missing:
        if _iptables(iptables, "-C", rule.chain, *rule.spec()).returncode == 0:
            continue
        done = _iptables(iptables, "-I", rule.chain, *rule.spec())
        if done.returncode != 0:
            raise EgressUnavailable(f"`{iptables} -I {rule.chain} ...` failed: {_failure(done)}")
    for item in extra:
        done = _iptables(iptables, "-D", item.chain, *item.spec)
        if done.returncode != 0:  # a stale DROP of ours only filters more; anything else is checked below
            logger.warning("sandbox.egress_stale_rule", extra={"rule": item.spec, "error": _failure(done)})
    if missing or extra:
        logger.info("sandbox.egress_rules_installed", extra={"added": len(missing), "removed": len(extra)})
        missing, extra = _changes(iptables, wanted)
        if missing:
            raise EgressUnavailable(f"{len(missing)} egress rules are still missing after installing them")
        foreign = [item for item in extra if item.rule is None]  # tagged like ours, not a DROP we wrote
        if foreign:
            raise EgressUnavailable(
                f"a rule tagged {TAG} that this server did not write cannot be removed from "
                f"{foreign[0].chain}: {' '.join(foreign[0].spec)}"
            )
    if not _forward_reaches_docker_user(iptables):
        raise EgressUnavailable(
            f"the FORWARD chain does not jump to {FORWARD_CHAIN}, so its rules filter nothing"
        )


# --- the gate before a network-enabled call --------------------------------------------------------------

_verified: tuple[tuple[str, ...], float] | None = None  # (what was verified, when)
_lock = threading.Lock()


def require_egress_filter(network: str) -> None:
    """Before a network-enabled container runs a tool: the filter is in place, or EgressUnavailable.

    Verified at most every SANDBOX_EGRESS_CHECK_TTL seconds per process and whenever the settings it
    depends on change (a failure is never cached: the next call tries again).
    """
    global _verified
    mode = settings.SANDBOX_EGRESS_FILTER
    if mode == "external":
        return
    if mode != "iptables":
        raise EgressUnavailable(
            _advice(f"SANDBOX_EGRESS_FILTER is {mode!r}, not one of {', '.join(FILTER_MODES)}")
        )
    binary = settings.SANDBOX_EGRESS_IPTABLES
    allow = tuple(settings.SANDBOX_EGRESS_ALLOW_CIDRS)
    key = (network, binary, *allow)
    with _lock:
        now = time.monotonic()
        if (
            _verified is not None
            and _verified[0] == key
            and now - _verified[1] < settings.SANDBOX_EGRESS_CHECK_TTL
        ):
            return
        _verified = None
        try:
            install_egress_filter(network=network, allow=allow, iptables=binary)
        except EgressUnavailable as exc:
            logger.warning("sandbox.egress_unavailable", extra={"network": network, "error": str(exc)})
            raise EgressUnavailable(_advice(str(exc))) from None
        _verified = (key, time.monotonic())


def forget_egress_check() -> None:
    """Verify again on the next network-enabled call (tests; after the host's firewall was reset)."""
    global _verified
    _verified = None


def _advice(why: str) -> str:
    return (
        "this sandbox config has network access, but the egress filter that keeps tools away from "
        f"private addresses and from this host is not in place: {why}. The tool was not run. The "
        "operator can let the server install the filter (root or CAP_NET_ADMIN in the Docker host's "
        "network namespace, with iptables; see SANDBOX_EGRESS_IPTABLES), set "
        "SANDBOX_EGRESS_FILTER=external if they filter SANDBOX_NETWORK themselves, or turn network "
        "access off in the sandbox config."
    )


def _after_fork() -> None:
    global _verified, _lock
    _verified, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
