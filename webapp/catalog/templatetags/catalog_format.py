"""Display filters for the catalog: parameter counts as people say them."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def params(count: int | None) -> str:
    """A parameter count as ``134.5M``, ``1.2B`` or ``45.0K``; a dash when unknown."""
    if count is None:
        return "\N{EN DASH}"
    for scale, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix}"
    return str(count)
