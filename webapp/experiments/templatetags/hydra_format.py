"""Small display filters for experiment pages."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.experiments.listing import model_key, model_short_label
from webapp.experiments.model_shapes import FAMILY_LABELS, PRESETS

register = template.Library()


@register.filter
def short_value(value: Any) -> str:
    """A hyperparameter value as people write it: 0.0003 as 3e-04, whole numbers plain, booleans as YAML's
    true and false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as ``1h 02m``, ``3m 05s`` or ``42s``."""
    if seconds is None:
        return "\N{EN DASH}"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def model_label(model: dict[str, Any]) -> str:
    """An experiment's stored model choice in words."""
    kind = model.get("kind")
    if kind == "preset":
        return PRESETS.get(model.get("preset", ""), (str(model.get("preset")), None))[0]
    if kind == "custom":
        family = FAMILY_LABELS.get(str(model.get("family") or "gpt2"), model.get("family"))
        kv = f" ({model['n_kv_head']} key/value)" if model.get("n_kv_head") else ""
        inner = f", MLP {model['n_inner']} wide" if model.get("n_inner") else ""
        return (f"Custom {family}: {model.get('n_layer')} layers, {model.get('n_embd')} wide, "
                f"{model.get('n_head')} heads{kv}{inner}, {model.get('n_positions')} positions")
    base = f" (base in {model['base_dtype']})" if model.get("base_dtype") else ""
    if kind == "checkpoint":
        return f"Pretrained checkpoint: {model.get('checkpoint_name')}{base}"
    return f"Pretrained: {model.get('pretrained_dir')}{base}"


@register.filter
def model_short(model: dict[str, Any]) -> str:
    """An experiment's stored model choice in a few words, for a table's column."""
    return model_short_label(model_key(model))


@register.simple_tag(takes_context=True)
def page_query(context: template.Context, number: int) -> str:
    """The query string of the page `number` of a paginated list, keeping the request's other parameters
    (the leaderboard's metric, the lab queue's host)."""
    query = context["request"].GET.copy()
    query["page"] = str(number)
    return "?" + query.urlencode()
