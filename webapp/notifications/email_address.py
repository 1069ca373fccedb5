"""Which notification e-mail addresses Hydra sends to: a bare address, ``name@lab.example``, and nothing more.

An address becomes a message's ``To`` header and its SMTP recipient, so anything a mail library or server
could read as more than one plain address is refused: line breaks and every other control or invisible
character (a header ends at CR/LF; some readers also split at U+2028 or a vertical tab), whitespace, display
names (``Ops <ops@lab.example>``), quoted local parts (``"a,b"@lab.example``), domain literals
(``ops@[10.0.0.1]``) and lists (``a@lab.example, b@lab.example``). What remains must also pass Django's own
validator. The team's form checks each address when it is saved, and the delivery checks it again before
each send, so a value that reached the database by another way is refused there too.
"""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

MAX_CHARS = 254  # RFC 5321's limit for a forward path
SPECIALS = frozenset('"(),:;<>[\\]')  # RFC 5322 specials but "@" and ".": quoting, groups, display names, lists


class AddressRefused(ValueError):
    """A value that is not one plain e-mail address Hydra may send to."""


def email_address_check(address: str) -> str:
    """Return `address` if it is one plain e-mail address safe to put in a header; raise AddressRefused saying
    what is wrong with it otherwise."""
    if not address:
        raise AddressRefused("An e-mail address cannot be empty.")
    if len(address) > MAX_CHARS:
        raise AddressRefused(f"An e-mail address has at most {MAX_CHARS} characters.")
    if any(_hidden(ch) for ch in address):
        raise AddressRefused("An e-mail address has no line breaks, spaces, control or invisible characters.")
    if SPECIALS.intersection(address) or address.count("@") != 1:
        raise AddressRefused("Give the bare address (name@lab.example): one @, and no display name, quotes, "
                             "brackets, commas or semicolons.")
    try:
        validate_email(address)
    except ValidationError:
        raise AddressRefused("Give one such as name@lab.example.") from None
    return address


def _hidden(ch: str) -> bool:
    """Whitespace, a control, format or separator character (Unicode categories C* and Z*)."""
    return ch.isspace() or unicodedata.category(ch)[0] in "CZ"
