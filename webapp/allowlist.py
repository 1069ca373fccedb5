"""Which addresses a webhook may reach: the administrator's ``HYDRA_WEBHOOK_ALLOWED_HOSTS``.

The setting is a comma-separated list of host names (``hooks.example.org``) and IP networks or addresses
(``10.0.0.0/8``, ``192.0.2.7``, ``2001:db8::/32``), each allowing the scheme's default port only (80 for
http://, 443 for https://, written or implied), or the one port the entry names after a colon instead:
``localhost:8080``, ``10.0.0.0/8:9000``, and for IPv6 in brackets, ``[::1]:8080``, ``[2001:db8::/32]:9000``
(an IPv6 entry without brackets names no port). List an entry twice to allow two ports.

A URL whose host name is listed (for its port) is allowed whatever it resolves to; any other is allowed only
when every address it resolves to lies in a network listed for its port. The default, an empty list, allows no
webhook at all, so a team cannot make the server call its own loopback, the lab's private network or a cloud
metadata address (169.254.169.254) unless the administrator lists it; and listing a host for its web server
does not open its other services (``localhost`` does not let a webhook talk to Redis on port 6379).

Pure (stdlib only), beside the configuration that reads the setting with `allowlist_parse`
(`webapp.config.notify`); the notifications' webhook form and delivery both ask `url_check` (the delivery
connects only to the addresses the check resolved and vetted).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_PORT = 65535
MAX_URL_CHARS = 2000


class WebhookRefused(ValueError):
    """A webhook URL that is malformed or that the allowlist does not let the server reach."""


@dataclass(frozen=True)
class HostEntry:
    name: str  # lower case, allowed whatever it resolves to
    port: int | None = None  # None: the scheme's default port

    def __str__(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


@dataclass(frozen=True)
class NetworkEntry:
    network: Network
    port: int | None = None  # None: the scheme's default port

    def __str__(self) -> str:
        where = str(self.network.network_address if self.network.num_addresses == 1 else self.network)
        if self.port is None:
            return where
        return f"[{where}]:{self.port}" if self.network.version == 6 else f"{where}:{self.port}"


@dataclass(frozen=True)
class Allowlist:
    hosts: tuple[HostEntry, ...] = ()
    networks: tuple[NetworkEntry, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.hosts or self.networks)

    def host_allowed(self, host: str, *, port: int, default_port: int) -> bool:
        return any(entry.name == host and _port_allowed(entry.port, port, default_port) for entry in self.hosts)

    def address_allowed(self, address: Address, *, port: int, default_port: int) -> bool:
        return any(address.version == entry.network.version and address in entry.network
                   and _port_allowed(entry.port, port, default_port) for entry in self.networks)

    def describe(self) -> str:
        return ", ".join([*sorted(map(str, self.hosts)), *map(str, self.networks)]) or "nothing"


def _port_allowed(listed: int | None, port: int, default_port: int) -> bool:
    return port == (default_port if listed is None else listed)


def allowlist_parse(raw: str) -> Allowlist:
    """Parse the setting's value; raise ValueError naming the first entry that is neither a host name nor an
    IP network, or whose port is not a number from 1 to 65535 (a network with host bits set, ``10.0.0.1/8``,
    is refused as a likely typo)."""
    hosts: dict[HostEntry, None] = {}
    networks: dict[NetworkEntry, None] = {}
    for entry in (item.strip() for item in raw.split(",")):
        if not entry:
            continue
        where, port = _port_split(entry)
        try:
            networks[NetworkEntry(ipaddress.ip_network(where), port)] = None
            continue
        except ValueError as error:
            if "/" in where or _looks_numeric(where) or entry.startswith("["):
                raise ValueError(f"{entry!r} is not an IP network ({error})") from None
        name = where.lower().rstrip(".")
        if not host_name_valid(name):
            raise ValueError(f"{entry!r} is neither a host name nor an IP network")
        hosts[HostEntry(name, port)] = None
    return Allowlist(hosts=tuple(hosts), networks=tuple(networks))


def _port_split(entry: str) -> tuple[str, int | None]:
    """An entry's host or network and the port it names (None when it names none). A bracketed entry
    (``[::1]:8080``) may name one after its closing bracket; an unbracketed one only when it has a single
    colon, as any IPv6 address has two or more."""
    if entry.startswith("["):
        where, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r} is not [IPv6 address or network] or [IPv6 address or network]:port")
        return where, _port_parse(entry, rest[1:]) if rest else None
    if entry.count(":") == 1:
        where, _, port = entry.partition(":")
        return where, _port_parse(entry, port)
    return entry, None


def _port_parse(entry: str, raw: str) -> int:
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_PORT):
        raise ValueError(f"{entry!r} names the port {raw!r}; a port is a number from 1 to {MAX_PORT}")
    return int(raw)


def _looks_numeric(entry: str) -> bool:
    return ":" in entry or entry.replace(".", "").isdigit()


def host_name_valid(name: str) -> bool:
    return 0 < len(name) <= 253 and all(HOST_LABEL.match(label) for label in name.split("."))


@dataclass(frozen=True)
class Target:
    """A webhook URL the allowlist lets the server reach, with the addresses to connect to (all vetted)."""

    url: SplitResult
    host: str
    port: int
    addresses: tuple[str, ...]


def url_parse(url: str) -> SplitResult:
    """The parts of a webhook URL; raise WebhookRefused unless it is an absolute http(s) URL with a host, no
    credentials and at most `MAX_URL_CHARS` characters."""
    if len(url) > MAX_URL_CHARS:
        raise WebhookRefused(f"A webhook URL has at most {MAX_URL_CHARS} characters.")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise WebhookRefused("A webhook URL has no spaces or control characters.")
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise WebhookRefused(f"{url!r} is not an http:// or https:// URL.")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise WebhookRefused(f"{url!r} has an invalid port.")
    if not parts.hostname:
        raise WebhookRefused(f"{url!r} names no host.")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("Put no user name or password in a webhook URL; requests are signed instead.")
    if parts.fragment:
        raise WebhookRefused("A webhook URL has no #fragment.")
    return parts


def url_check(url: str, allowlist: Allowlist, *, resolve=socket.getaddrinfo) -> Target:
    """Check `url` against `allowlist` and return where to connect; raise WebhookRefused saying why not.

    The host is resolved here (an IP literal stands for itself). Unless the host name itself is listed for the
    URL's port (written, or the scheme's default), every address it resolves to must lie in a network listed
    for that port: a name that resolves to one allowed and one forbidden address is refused, as the connection
    could reach either.
    """
    parts = url_parse(url)
    host = parts.hostname.lower().rstrip(".")  # type: ignore[union-attr] -- url_parse checked it
    default_port = DEFAULT_PORTS[parts.scheme.lower()]
    port = default_port if parts.port is None else parts.port
    if not allowlist:
        raise WebhookRefused("The administrator allows no webhook addresses (HYDRA_WEBHOOK_ALLOWED_HOSTS is empty).")
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise WebhookRefused(f"The host {host!r} cannot be resolved ({error}).") from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise WebhookRefused(f"The host {host!r} resolves to no address.")
    if not allowlist.host_allowed(host, port=port, default_port=default_port):
        for address in addresses:
            if not allowlist.address_allowed(ipaddress.ip_address(address), port=port, default_port=default_port):
                named = "" if address == host else f" (it resolves to {address})"
                raise WebhookRefused(
                    f"The administrator does not allow webhooks to {host}{named} on port {port}; allowed: "
                    f"{allowlist.describe()} (an entry without a port allows only 80 for http://, 443 for "
                    "https://).")
    return Target(url=parts, host=host, port=port, addresses=addresses)
