"""Which addresses a webhook may reach: the administrator's ``HYDRA_WEBHOOK_ALLOWED_HOSTS``.

The setting is a comma-separated list of host names (``hooks.example.org``) and IP networks or addresses
(``10.0.0.0/8``, ``192.0.2.7``, ``2001:db8::/32``). A URL whose host name is listed is allowed whatever it
resolves to; any other host is allowed only when every address it resolves to lies in a listed network. The
default, an empty list, allows no webhook at all, so a team cannot make the server call its own loopback, the
lab's private network or a cloud metadata address (169.254.169.254) unless the administrator lists it.

Pure (stdlib only): the configuration reads the setting with `allowlist_parse`, and the webhook form and the
delivery both ask `url_check` (the delivery connects only to the addresses the check resolved and vetted).
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
MAX_URL_CHARS = 2000


class WebhookRefused(ValueError):
    """A webhook URL that is malformed or that the allowlist does not let the server reach."""


@dataclass(frozen=True)
class Allowlist:
    hosts: frozenset[str] = frozenset()  # lower-case host names, allowed whatever they resolve to
    networks: tuple[Network, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.hosts or self.networks)

    def address_allowed(self, address: Address) -> bool:
        return any(address.version == network.version and address in network for network in self.networks)

    def describe(self) -> str:
        return ", ".join([*sorted(self.hosts), *map(str, self.networks)]) or "nothing"


def allowlist_parse(raw: str) -> Allowlist:
    """Parse the setting's value; raise ValueError naming the first entry that is neither a host name nor an
    IP network (a network with host bits set, ``10.0.0.1/8``, is refused as a likely typo)."""
    hosts: set[str] = set()
    networks: list[Network] = []
    for entry in (item.strip() for item in raw.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry))
            continue
        except ValueError as error:
            if "/" in entry or _looks_numeric(entry):
                raise ValueError(f"{entry!r} is not an IP network ({error})") from None
        name = entry.lower().rstrip(".")
        if not host_name_valid(name):
            raise ValueError(f"{entry!r} is neither a host name nor an IP network")
        hosts.add(name)
    return Allowlist(hosts=frozenset(hosts), networks=tuple(networks))


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
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise WebhookRefused(f"{url!r} has an invalid port.") from None
    if not parts.hostname:
        raise WebhookRefused(f"{url!r} names no host.")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("Put no user name or password in a webhook URL; requests are signed instead.")
    if parts.fragment:
        raise WebhookRefused("A webhook URL has no #fragment.")
    return parts


def url_check(url: str, allowlist: Allowlist, *, resolve=socket.getaddrinfo) -> Target:
    """Check `url` against `allowlist` and return where to connect; raise WebhookRefused saying why not.

    The host is resolved here (an IP literal stands for itself). Unless the host name itself is listed, every
    address it resolves to must lie in a listed network: a name that resolves to one allowed and one
    forbidden address is refused, as the connection could reach either.
    """
    parts = url_parse(url)
    host = parts.hostname.lower().rstrip(".")  # type: ignore[union-attr] -- url_parse checked it
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    if not allowlist:
        raise WebhookRefused("The administrator allows no webhook addresses (HYDRA_WEBHOOK_ALLOWED_HOSTS is empty).")
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise WebhookRefused(f"The host {host!r} cannot be resolved ({error}).") from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise WebhookRefused(f"The host {host!r} resolves to no address.")
    if host not in allowlist.hosts:
        for address in addresses:
            if not allowlist.address_allowed(ipaddress.ip_address(address)):
                named = "" if address == host else f" (it resolves to {address})"
                raise WebhookRefused(
                    f"The administrator does not allow webhooks to {host}{named}; allowed: {allowlist.describe()}.")
    return Target(url=parts, host=host, port=port, addresses=addresses)
