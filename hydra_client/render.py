"""Plain-text output of the command line: aligned tables and short numbers, durations and sizes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """`rows` as left-aligned columns (`columns`: key and header), one line per row; a dash for empty cells."""
    cells = [[header for _, header in columns]]
    cells += [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, Mapping):
        return params(value)
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    return str(value)


def number(value: float | None) -> str:
    """Four significant digits, or a dash."""
    return "-" if value is None else f"{value:.4g}"


def params(values: Mapping[str, Any]) -> str:
    """A trial's parameters as ``key=value`` pairs."""
    return " ".join(f"{key}={json.dumps(v) if isinstance(v, str | list | dict) else cell(v)}"
                    for key, v in values.items())


def duration(seconds: float | None) -> str:
    """Seconds as ``1h02m``, ``3m05s`` or ``12s``; a dash when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def size(n_bytes: int | None) -> str:
    """Bytes in B, kB, MB, GB or TB (powers of 1000, as a download shows them)."""
    if n_bytes is None:
        return "-"
    value = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def document(data: Any) -> str:
    """One JSON document, as ``--json`` prints it."""
    return json.dumps(data, indent=2, sort_keys=False, default=str)
