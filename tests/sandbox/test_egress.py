"""The egress filter of network-enabled sandboxes (apps/sandbox/egress.py): a tool with network access
reaches no private address and not this host, and when the filter cannot be put in place it does not run.

The Docker tests use the real engine, the host's real iptables and a real network namespace as "a host on
a private network" (10.213.7.2 and .3, veth to 10.213.7.1 on this host). They send traffic only to
127.0.0.1, this machine's Docker bridges, that namespace and 169.254.169.254 (which the filter drops
before it leaves: its DROP counter is checked). They need root, like the filter itself.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.agents.custom_tools import run_custom_tool
from apps.core.actor import Actor
from apps.sandbox import docker_sandbox, egress
from apps.sandbox.docker_sandbox import get_client
from apps.sandbox.egress import (
    BRIDGE,
    FORWARD_CHAIN,
    INPUT_CHAIN,
    TAG,
    Listed,
    Rule,
    blocked_networks,
    filter_rules,
    network_problems,
    rule_changes,
    tagged_rules,
)
from apps.sandbox.models import SandboxConfig
from apps.tools.execution import ToolContext
from tests.agents.test_loop import custom_tool
from tests.sandbox.conftest import own_containers

NS_HOST_SIDE = "10.213.7.1"  # this host's end of the veth: a host address like any other
ALLOWED = "10.213.7.2"  # in the namespace; allowed in the second test
NEIGHBOUR = "10.213.7.3"  # in the namespace; never allowed
NS_PORT = 8080
METADATA = "169.254.169.254"

PROBE = '''
import concurrent.futures, re, socket

def _connect(target):
    host, port = target.rsplit(":", 1)
    sock = socket.socket()
    sock.settimeout(1.5)
    try:
        sock.connect((host, int(port)))
        return "connected"
    except OSError as exc:
        return type(exc).__name__
    finally:
        sock.close()

def probe(targets: list) -> dict:
    """Tries a TCP connection to each target; resolves this container's own id through Docker's DNS.

    Args:
        targets (list): "address:port" strings
    """
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        reached = dict(zip(targets, pool.map(_connect, targets)))
    short_id = re.search(r"/containers/([0-9a-f]{64})/", open("/proc/self/mountinfo").read()).group(1)[:12]
    try:
        ipv6 = open("/proc/net/if_inet6").read()
    except OSError:
        ipv6 = ""
    return {
        "reached": reached,
        "dns": socket.gethostbyname(short_id + "."),  # absolute: no search domain, only Docker's DNS knows it
        "in_etc_hosts": short_id in open("/etc/hosts").read(),
        "own_address": socket.gethostbyname("sandbox"),  # /etc/hosts
        "ipv6": ipv6,
    }
'''


# --- pure ---------------------------------------------------------------------------------------------------


def covered(address: str, networks: list[ipaddress.IPv4Network]) -> bool:
    return any(ipaddress.IPv4Address(address) in n for n in networks)


def test_every_range_python_calls_non_global_is_blocked():
    blocked = blocked_networks()
    python_non_global = [
        *ipaddress._IPv4Constants._private_networks,  # what is_private / is_global use
        ipaddress._IPv4Constants._public_network,  # 100.64.0.0/10, "shared": not global
    ]

    for network in python_non_global:
        assert any(network.subnet_of(b) for b in blocked), network
    for network in blocked:  # and nothing Python calls global, but multicast
        assert not network.network_address.is_global or network.network_address.is_multicast, network


def test_the_blocked_ranges_include_the_metadata_service_and_leave_the_internet():
    blocked = blocked_networks()

    for address in (
        METADATA,
        "127.0.0.1",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "224.0.0.1",
    ):
        assert covered(address, blocked), address
    for address in ("1.1.1.1", "8.8.8.8", "9.9.9.9", "151.101.1.69", "172.32.0.1", "100.128.0.1"):
        assert not covered(address, blocked), address
    assert blocked == sorted(blocked)
    assert all(not a.overlaps(b) for i, a in enumerate(blocked) for b in blocked[i + 1 :])


def test_an_allowed_cidr_is_carved_out_and_nothing_else():
    base = blocked_networks()
    carved = blocked_networks([f" {ALLOWED}/32", "", "8.8.8.0/24"])

    assert not covered(ALLOWED, carved)
    assert covered(NEIGHBOUR, carved)
    assert covered(NS_HOST_SIDE, carved)
    assert sum(n.num_addresses for n in carved) == sum(n.num_addresses for n in base) - 1
    assert blocked_networks(["10.0.0.0/8"]) == [n for n in base if n != ipaddress.IPv4Network("10.0.0.0/8")]
    assert blocked_networks(["10.213.7.9/24"]) == blocked_networks(["10.213.7.0/24"])  # host bits ignored


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "not-a-cidr", "fd00::/8"])
def test_an_allow_list_with_anything_but_ipv4_cidrs_is_refused(bad):
    with pytest.raises(ValueError):
        blocked_networks([bad])


def test_the_rules_drop_everything_to_the_host_and_the_blocked_ranges_forwarded():
    rules = filter_rules(BRIDGE, blocked_networks()[:2])

    assert rules == [
        Rule(INPUT_CHAIN, BRIDGE),
        Rule(FORWARD_CHAIN, BRIDGE, "0.0.0.0/8"),
        Rule(FORWARD_CHAIN, BRIDGE, "10.0.0.0/8"),
    ]
    assert rules[1].spec() == [
        "-d",
        "0.0.0.0/8",
        "-i",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        TAG,
        "-j",
        "DROP",
    ]
    assert rules[0].spec() == ["-i", BRIDGE, "-m", "comment", "--comment", TAG, "-j", "DROP"]


def test_listed_rules_are_read_back_with_their_counters_and_only_ours():
    listing = "\n".join(
        [
            "-P INPUT ACCEPT",
            f"-A DOCKER-USER -d 10.213.7.2/32 -i {BRIDGE} -m comment --comment {TAG} -c 7 420 -j DROP",
            f"-A INPUT -i {BRIDGE} -m comment --comment {TAG} -c 0 0 -j DROP",
            f"-A INPUT ! -i {BRIDGE} -m comment --comment {TAG} -j DROP",
            '-A INPUT -i eth0 -m comment --comment "someone else" -j ACCEPT',
            "-A DOCKER-USER -j RETURN",
        ]
    )

    listed = tagged_rules(listing)

    assert [(item.chain, item.rule, item.packets) for item in listed] == [
        (FORWARD_CHAIN, Rule(FORWARD_CHAIN, BRIDGE, "10.213.7.2/32"), 7),
        (INPUT_CHAIN, Rule(INPUT_CHAIN, BRIDGE), 0),
        (INPUT_CHAIN, None, 0),  # tagged, but not a shape we write: it goes
    ]
    assert listed[0].spec == (
        "-d",
        "10.213.7.2/32",
        "-i",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        TAG,
        "-j",
        "DROP",
    )


def test_changes_add_what_is_missing_and_remove_stale_and_duplicate_rules():
    keep, gone, new = (Rule(FORWARD_CHAIN, BRIDGE, f"{n}.0.0.0/8") for n in (10, 11, 12))
    listed = [Listed(FORWARD_CHAIN, r, (), 0) for r in (keep, keep, gone)]

    missing, extra = rule_changes([keep, new], listed)

    assert missing == [new]
    assert [item.rule for item in extra] == [keep, gone]


def test_only_a_bridge_network_on_our_bridge_without_icc_and_ipv6_is_accepted():
    ours = {
        "Driver": "bridge",
        "EnableIPv6": False,
        "Options": {
            "com.docker.network.bridge.name": BRIDGE,
            "com.docker.network.bridge.enable_icc": "false",
        },
    }
    docker0 = {
        "Driver": "bridge",
        "EnableIPv6": True,
        "Options": {
            "com.docker.network.bridge.name": "docker0",
            "com.docker.network.bridge.enable_icc": "true",
        },
    }

    assert network_problems(ours, BRIDGE) == []
    assert network_problems(docker0, BRIDGE) == [
        f"its Linux bridge is docker0, not {BRIDGE}",
        "its containers may talk to each other (enable_icc is not false)",
        "it has IPv6, which this filter does not cover",
    ]
    assert network_problems({"Driver": "bridge", "Options": {}}, BRIDGE)[0].startswith(
        "its Linux bridge is chosen by Docker"
    )


# --- real engine, real iptables, real namespaces ------------------------------------------------------------


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def _need_root() -> None:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"):
        pytest.skip("the egress tests need root, iproute2 and iptables (as the filter itself does)")


@pytest.fixture
def test_host() -> Iterator[None]:
    """A network namespace with ALLOWED and NEIGHBOUR, a TCP listener on NS_PORT, veth to NS_HOST_SIDE."""
    _need_root()
    for leftover in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split():
        match = re.fullmatch(r"letta-egress-(\d+)", leftover)
        if match and not Path(f"/proc/{match.group(1)}").exists():  # an interrupted run's
            subprocess.run(["ip", "netns", "del", leftover], check=False)
    ns, veth, peer = f"letta-egress-{os.getpid()}", f"legr{os.getpid()}", f"legr{os.getpid()}n"
    _sh("ip", "netns", "add", ns)
    listener = None
    try:
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        _sh("ip", "link", "set", peer, "netns", ns)
        _sh("ip", "addr", "add", f"{NS_HOST_SIDE}/24", "dev", veth)
        _sh("ip", "link", "set", veth, "up")
        for address in (ALLOWED, NEIGHBOUR):
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", peer)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
        serve = (
            "import socket\n"
            f"server = socket.create_server(('0.0.0.0', {NS_PORT}))\n"
            "while True:\n    server.accept()[0].close()\n"
        )
        listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", serve])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((ALLOWED, NS_PORT), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield
    finally:
        if listener is not None:
            listener.terminate()
            listener.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", ns], check=False)  # takes the veth pair with it
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)


@pytest.fixture
def host_port() -> Iterator[int]:
    """A TCP port this test process listens on, on every host address (0.0.0.0)."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def networked(docker_settings, actor) -> Iterator[str]:
    """The actor's organisation has a network-enabled Docker sandbox config; yields SANDBOX_NETWORK.

    Afterwards the production rules (no allow list) are put back: rules a test allowed do not stay.
    """
    _need_root()
    SandboxConfig.objects.for_actor(actor).create(
        sandbox_type=SandboxConfig.Type.DOCKER, network_enabled=True
    )
    network = docker_settings.SANDBOX_NETWORK
    egress.forget_egress_check()
    yield network
    egress.forget_egress_check()
    egress.install_egress_filter(network=network, allow=())


def run_probe(api_client_for, actor, targets: list[str]) -> dict:
    response = api_client_for(actor).post(
        "/v1/tools/run", {"source_code": PROBE, "args": {"targets": targets}}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["sandbox"]) == ("success", "docker"), body["tool_return"]
    return json.loads(body["tool_return"])


def packets(rule: Rule) -> int:
    listed = [item for item in egress.installed_rules(rule.chain) if item.rule == rule]
    assert listed, f"rule missing: {rule}"
    return sum(item.packets for item in listed)


def gateway(network: str) -> str:
    return get_client().api.inspect_network(network)["IPAM"]["Config"][0]["Gateway"]


@pytest.mark.docker
def test_a_networked_tool_reaches_no_private_address_and_not_this_host(
    networked, test_host, host_port, actor, api_client_for
):
    egress.install_egress_filter(network=networked, allow=())  # in place before anything is sent
    metadata_rule = Rule(FORWARD_CHAIN, BRIDGE, "169.254.0.0/16")
    private_rule = Rule(FORWARD_CHAIN, BRIDGE, "10.0.0.0/8")
    host_rule = Rule(INPUT_CHAIN, BRIDGE)
    before = {rule: packets(rule) for rule in (metadata_rule, private_rule, host_rule)}
    own_gateway = gateway(networked)
    host = [f"{own_gateway}:{host_port}", f"172.17.0.1:{host_port}", f"{NS_HOST_SIDE}:{host_port}"]
    private = [f"{METADATA}:80", f"{ALLOWED}:{NS_PORT}", f"{NEIGHBOUR}:{NS_PORT}"]

    seen = run_probe(api_client_for, actor, [*host, f"127.0.0.1:{host_port}", *private])

    assert seen["reached"] == {
        **dict.fromkeys(host, "TimeoutError"),  # dropped in INPUT: the host's ports on any address
        f"127.0.0.1:{host_port}": "ConnectionRefusedError",  # the container's own loopback
        **dict.fromkeys(private, "TimeoutError"),  # dropped in DOCKER-USER
    }
    assert packets(metadata_rule) > before[metadata_rule]  # dropped here, never sent on
    assert packets(private_rule) > before[private_rule]
    assert packets(host_rule) > before[host_rule]
    # Docker's embedded DNS needs no exception: it answers inside the container's own namespace.
    assert (seen["in_etc_hosts"], seen["dns"]) == (False, seen["own_address"])
    assert ipaddress.IPv4Address(seen["own_address"]) in ipaddress.IPv4Network(
        get_client().api.inspect_network(networked)["IPAM"]["Config"][0]["Subnet"]
    )
    assert seen["ipv6"] == ""  # IPv6 is off on the network: no IPv6 address, no IPv6 path


@pytest.mark.docker
def test_an_allowed_cidr_is_reached_and_its_neighbour_and_the_host_are_not(
    networked, test_host, host_port, actor, api_client_for, docker_settings
):
    docker_settings.SANDBOX_EGRESS_ALLOW_CIDRS = [f"{ALLOWED}/32"]  # re-applied by the next call

    seen = run_probe(
        api_client_for,
        actor,
        [f"{ALLOWED}:{NS_PORT}", f"{NEIGHBOUR}:{NS_PORT}", f"{NS_HOST_SIDE}:{host_port}"],
    )

    assert seen["reached"] == {
        f"{ALLOWED}:{NS_PORT}": "connected",  # traffic flows: the filter is what stops the others
        f"{NEIGHBOUR}:{NS_PORT}": "TimeoutError",
        f"{NS_HOST_SIDE}:{host_port}": "TimeoutError",
    }
    assert Rule(FORWARD_CHAIN, BRIDGE, "10.0.0.0/8") not in {
        i.rule for i in egress.installed_rules(FORWARD_CHAIN)
    }


@pytest.mark.docker
def test_rules_that_went_missing_are_put_back_before_the_next_networked_call(networked):
    egress.install_egress_filter(network=networked, allow=())
    host_rule = Rule(INPUT_CHAIN, BRIDGE)
    subprocess.run(["iptables", "-D", INPUT_CHAIN, *host_rule.spec()], check=True, capture_output=True)

    egress.require_egress_filter(networked)

    assert host_rule in {item.rule for item in egress.installed_rules(INPUT_CHAIN)}


def _nothing_started(run: Callable[[], Any]) -> tuple[Any, bool]:
    """Run `run`; and did no sandbox container start meanwhile (none listed, none counted by the pool)?"""
    pool = docker_sandbox.get_pool()
    pool.drain()
    containers, started = {c.id for c in own_containers()}, pool.stats.started
    result = run()
    pool.drain()
    return result, ({c.id for c in own_containers()}, pool.stats.started) == (containers, started)


@pytest.mark.docker
def test_without_iptables_a_networked_tool_fails_closed_and_no_container_starts(
    networked, docker_settings, org
):
    docker_settings.SANDBOX_EGRESS_IPTABLES = "/nonexistent/iptables"
    tool = custom_tool(org, name="probe", source=PROBE)

    result, nothing_started = _nothing_started(
        lambda: run_custom_tool(
            tool, {"targets": [f"{METADATA}:80"]}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x")
        )
    )

    assert (result.status, result.sandbox) == ("error", "docker")
    assert (
        "there is no iptables program '/nonexistent/iptables' (SANDBOX_EGRESS_IPTABLES)"
        in result.return_value
    )
    assert "The tool was not run" in result.return_value
    assert "SANDBOX_EGRESS_FILTER=external" in result.return_value
    assert nothing_started


@pytest.mark.docker
def test_without_root_a_networked_tool_fails_closed(
    networked, docker_settings, actor, api_client_for, tmp_path
):
    unprivileged = tmp_path / "iptables"  # the real iptables, run as nobody: what a non-root server gets
    unprivileged.write_text(
        '#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups iptables "$@"\n'
    )
    unprivileged.chmod(0o755)
    docker_settings.SANDBOX_EGRESS_IPTABLES = str(unprivileged)

    response, nothing_started = _nothing_started(
        lambda: api_client_for(actor).post(
            "/v1/tools/run", {"source_code": PROBE, "args": {"targets": [f"{METADATA}:80"]}}, format="json"
        )
    )

    body = response.json()
    assert (body["status"], body["sandbox"]) == ("error", "docker")
    assert "Permission denied (you must be root)" in body["tool_return"]
    assert "The tool was not run" in body["tool_return"]
    assert nothing_started


@pytest.mark.docker
def test_a_sandbox_network_that_is_not_the_filtered_one_fails_closed(networked, docker_settings, org):
    docker_settings.SANDBOX_NETWORK = "bridge"  # Docker's default bridge: what the server used before
    tool = custom_tool(org, name="probe", source=PROBE)

    result, nothing_started = _nothing_started(
        lambda: run_custom_tool(
            tool, {"targets": [f"{METADATA}:80"]}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x")
        )
    )

    assert result.status == "error"
    assert "the Docker network 'bridge' exists but is not the sandbox egress network" in result.return_value
    assert f"its Linux bridge is docker0, not {BRIDGE}" in result.return_value
    assert nothing_started


@pytest.mark.docker
def test_with_an_external_filter_nothing_is_checked(networked, docker_settings):
    docker_settings.SANDBOX_EGRESS_FILTER = "external"
    docker_settings.SANDBOX_EGRESS_IPTABLES = "/nonexistent/iptables"

    egress.require_egress_filter(networked)  # the operator filters SANDBOX_NETWORK: no error

    docker_settings.SANDBOX_EGRESS_FILTER = "nftables"
    with pytest.raises(egress.EgressUnavailable, match="SANDBOX_EGRESS_FILTER is 'nftables'"):
        egress.require_egress_filter(networked)


@pytest.mark.docker
def test_a_verified_filter_is_trusted_for_the_ttl_and_checked_again_after(networked, docker_settings, capsys):
    egress.require_egress_filter(networked)
    started = time.perf_counter()
    egress.require_egress_filter(networked)
    cached_ms = (time.perf_counter() - started) * 1000
    docker_settings.SANDBOX_EGRESS_CHECK_TTL = 0
    started = time.perf_counter()
    egress.require_egress_filter(networked)
    checked_ms = (time.perf_counter() - started) * 1000

    with capsys.disabled():
        print(f"\negress check: cached {cached_ms:.3f} ms, verified again {checked_ms:.1f} ms")  # noqa: T201
    assert cached_ms < 1
