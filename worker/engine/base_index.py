"""Where a host keeps its shared LoRA bases, and what they hold, read without torch.

The layout is ``worker/engine/shared_base.py``'s (which builds and reference-counts the bases):
``<spill_dir>/.bases/<key>/index.json`` holds the base's bytes and precision, ``refs/<trial id>`` one empty file
per trial using it. This module only reads that layout and imports nothing heavy, so the web process can list a host's
bases for its pages.
"""

from __future__ import annotations

import json
from pathlib import Path

BASES = ".bases"  # the directory of shared bases inside a host's spill directory
INDEX = "index.json"
REFS = "refs"


def base_bytes(spill_dir: Path, key: str) -> int:
    """The bytes of base ``key``'s frozen weights, as its index records them."""
    return int(json.loads((Path(spill_dir) / BASES / key / INDEX).read_text())["bytes"])


def _index(spill_dir: Path, key: str) -> tuple[int, str]:
    """Base ``key``'s bytes and precision (a base without the entry is fp32)."""
    index = json.loads((Path(spill_dir) / BASES / key / INDEX).read_text())
    return int(index["bytes"]), str(index.get("dtype", "fp32"))


def bases(spill_dir: Path) -> list[dict[str, object]]:
    """Every shared base of this host: key, bytes, precision (``dtype``) and the trials using it (for the
    host's page).

    A base being built (no index yet) or deleted while it is listed (its last trial let it go) is left out."""
    found: list[dict[str, object]] = []
    directory = Path(spill_dir) / BASES
    if not directory.is_dir():
        return found
    for root in sorted(directory.iterdir()):
        if not root.is_dir() or root.name.startswith("."):  # ".<key>.building": a base being written
            continue
        try:
            size, dtype = _index(spill_dir, root.name)
            refs = sorted(p.name for p in (root / REFS).iterdir()) if (root / REFS).is_dir() else []
        except FileNotFoundError:
            continue
        found.append({"key": root.name, "bytes": size, "dtype": dtype, "trials": refs})
    return found
