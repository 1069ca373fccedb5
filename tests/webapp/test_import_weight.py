"""The web process starts fast and small: loading every page's code never imports torch or transformers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, django
django.setup()
import webapp.urls, webapp.experiments.memory_preview, worker.engine.partition, worker.engine.config
from django.urls import get_resolver
get_resolver().url_patterns
heavy = sorted(name for name in ("torch", "transformers", "tokenizers.trainers") if name in sys.modules)
print(",".join(heavy))
"""


def test_it_loads_every_view_without_torch():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings", "DEBUG": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"the web process imported {result.stdout.strip()}"
