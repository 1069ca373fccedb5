"""The pages' Plotly is a bundle of the traces the figures draw, served from our own static files, compressed."""

from __future__ import annotations

import ast
import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VENDOR = ROOT / "static" / "vendor"
TRACE_KEYS = {"name", "mode", "orientation", "dimensions"}  # what only a trace, of the figures' dicts, has


def traces_in_figures() -> set[str]:
    """Every trace type a figure module of the web app writes as a literal (``{"type": "bar", "x": ...}``)."""
    found = set()
    for path in (ROOT / "webapp").rglob("figures.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Dict):
                continue
            entries = {key.value: value for key, value in zip(node.keys, node.values, strict=True)
                       if isinstance(key, ast.Constant)}
            kind = entries.get("type")
            if isinstance(kind, ast.Constant) and TRACE_KEYS & entries.keys():
                found.add(kind.value)
    return found


def test_the_bundle_has_every_trace_type_the_figures_draw():
    entry = (ROOT / "scripts" / "plotly-bundle" / "entry.js").read_text()
    registered = {"scatter"} | set(re.findall(r"require\('plotly\.js/lib/(\w+)'\)", entry)) - {"core"}
    used = traces_in_figures()
    assert {"scatter", "scattergl", "bar", "parcoords"} <= used  # the walk finds the figures' traces
    assert used <= registered, f"register {sorted(used - registered)} in scripts/plotly-bundle/entry.js, make plotly"
    banner = (VENDOR / "plotly.min.js").read_text()[:300]
    assert f"traces: {', '.join(sorted(registered))};" in banner  # the committed bundle is built from that entry


def test_the_bundle_is_a_third_of_the_full_one_and_its_gzip_copy_is_the_same_file():
    bundle = (VENDOR / "plotly.min.js").read_bytes()
    assert len(bundle) < 4_851_164 / 2  # plotly.js 3.7.0's full plotly.min.js
    assert gzip.decompress((VENDOR / "plotly.min.js.gz").read_bytes()) == bundle
    assert "MIT" in (VENDOR / "plotly.LICENSE").read_text()


def test_plotly_goes_gzipped_to_a_browser_that_takes_gzip(client):
    response = client.get("/static/vendor/plotly.min.js", HTTP_ACCEPT_ENCODING="gzip, br")
    body = b"".join(response.streaming_content)
    assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
    assert body == (VENDOR / "plotly.min.js.gz").read_bytes()
