"""Address blocks that are not globally reachable, written down from IANA's registries.

Python's ``is_global`` follows a list of its own, behind the registries and different between
Python versions: 3.11 takes the IPv6 documentation block ``3fff::/20`` (RFC 9637), the
deprecated site-local ``fec0::/10`` (RFC 3879) and the deprecated 6to4 relay anycast block
``192.88.99.0/24`` (RFC 7526) for public addresses. The fetch policy (``netpolicy``) asks this
table as well as Python's, and refuses what either calls special.

Sources, as published by IANA (columns "Address Block", "Name", "Globally Reachable"):

* IANA IPv4 Special-Purpose Address Registry,
  https://www.iana.org/assignments/iana-ipv4-special-registry/ (RFC 6890, RFC 8190);
* IANA IPv6 Special-Purpose Address Registry,
  https://www.iana.org/assignments/iana-ipv6-special-registry/ (RFC 6890, RFC 8190).

Each row is the registry's with its "Globally Reachable" value: True, False, or None where the
registry says N/A (Teredo and 6to4, whose reachability is that of the IPv4 address they embed;
``netpolicy.embedded_ipv4`` judges those). Two blocks the registries no longer list as
reachable are added as not reachable, as deprecated: IPv6 site-local ``fec0::/10`` (RFC 3879,
in the IPv6 Address Space registry as "Reserved by IETF") and the 6to4 relay anycast block
``192.88.99.0/24`` (RFC 7526, which deprecated it; the registry keeps it as "Deprecated (6to4
Relay Anycast)"). The most specific block containing an address decides, as the registry's
footnotes say for blocks inside "IETF Protocol Assignments" (``192.0.0.0/24``, ``2001::/23``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class SpecialBlock:
    network: IPNetwork
    name: str
    rfc: str
    globally_reachable: bool | None  # None: the registry's N/A


def _rows(rows: list[tuple[str, str, str, bool | None]]) -> tuple[SpecialBlock, ...]:
    return tuple(
        SpecialBlock(ipaddress.ip_network(block), name, rfc, reachable)
        for block, name, rfc, reachable in rows
    )


IPV4_SPECIAL = _rows(
    [
        ("0.0.0.0/8", '"This network"', "RFC 791", False),
        ("0.0.0.0/32", '"This host on this network"', "RFC 1122", False),
        ("10.0.0.0/8", "Private-Use", "RFC 1918", False),
        ("100.64.0.0/10", "Shared Address Space", "RFC 6598", False),
        ("127.0.0.0/8", "Loopback", "RFC 1122", False),
        ("169.254.0.0/16", "Link Local", "RFC 3927", False),
        ("172.16.0.0/12", "Private-Use", "RFC 1918", False),
        ("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890", False),
        ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", False),
        ("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", False),
        ("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", True),
        ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
        ("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880", False),
        ("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880", False),
        ("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", False),
        ("192.31.196.0/24", "AS112-v4", "RFC 7535", True),
        ("192.52.193.0/24", "AMT", "RFC 7450", True),
        # Deprecated by RFC 7526; added here as not reachable (see above).
        ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", False),
        ("192.168.0.0/16", "Private-Use", "RFC 1918", False),
        ("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", True),
        ("198.18.0.0/15", "Benchmarking", "RFC 2544", False),
        ("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", False),
        ("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", False),
        ("240.0.0.0/4", "Reserved", "RFC 1112", False),
        ("255.255.255.255/32", "Limited Broadcast", "RFC 919", False),
    ]
)

IPV6_SPECIAL = _rows(
    [
        ("::1/128", "Loopback Address", "RFC 4291", False),
        ("::/128", "Unspecified Address", "RFC 4291", False),
        ("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", False),
        ("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", True),
        ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", False),
        ("100::/64", "Discard-Only Address Block", "RFC 6666", False),
        ("100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", False),
        ("2001::/23", "IETF Protocol Assignments", "RFC 2928", False),
        ("2001::/32", "TEREDO", "RFC 4380", None),
        ("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", True),
        ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
        ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", True),
        ("2001:2::/48", "Benchmarking", "RFC 5180", False),
        ("2001:3::/32", "AMT", "RFC 7450", True),
        ("2001:4:112::/48", "AS112-v6", "RFC 7535", True),
        ("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", False),
        ("2001:20::/28", "ORCHIDv2", "RFC 7343", True),
        ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", True),
        ("2001:db8::/32", "Documentation", "RFC 3849", False),
        ("2002::/16", "6to4", "RFC 3056", None),
        ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", True),
        ("3fff::/20", "Documentation", "RFC 9637", False),
        ("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", False),
        ("fc00::/7", "Unique-Local", "RFC 4193", False),
        ("fe80::/10", "Link-Local Unicast", "RFC 4291", False),
        # Deprecated by RFC 3879; added here as not reachable (see above).
        ("fec0::/10", "Deprecated site-local", "RFC 3879", False),
    ]
)


def special_block(ip: IPAddress) -> SpecialBlock | None:
    """The most specific registry block holding ``ip``, or None when it is in none."""
    table = IPV4_SPECIAL if isinstance(ip, ipaddress.IPv4Address) else IPV6_SPECIAL
    found = [block for block in table if ip in block.network]
    return max(found, key=lambda block: block.network.prefixlen, default=None)


def not_globally_reachable(ip: IPAddress) -> SpecialBlock | None:
    """The registry block that makes ``ip`` not globally reachable, or None."""
    block = special_block(ip)
    return block if block is not None and block.globally_reachable is False else None
