"""Serve Plotly's JavaScript from the installed plotly package as ``vendor/plotly.min.js``.

Lab servers are often offline, so no page loads anything from a CDN; this finder also keeps a 4 MB
vendored copy out of the repository (``collectstatic`` copies it for production).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PLOTLY_FILE = "plotly.min.js"
PREFIX = "vendor"


class PlotlyFinder(BaseFinder):
    storage = FileSystemStorage(location=str(PLOTLY_DIR))

    def check(self, **kwargs: Any) -> list[object]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:
        if path == f"{PREFIX}/{PLOTLY_FILE}":
            match = str(PLOTLY_DIR / PLOTLY_FILE)
            return [match] if find_all else match
        # No match is an empty list either way, as Django's own finders answer: `finders.find` adds a
        # falsy non-list answer to its matches, and a "match" of "" would reach WhiteNoise as a path.
        return []

    def list(self, ignore_patterns: list[str] | None) -> Any:
        storage = FileSystemStorage(location=str(PLOTLY_DIR))
        storage.prefix = PREFIX  # type: ignore[attr-defined]
        yield PLOTLY_FILE, storage
