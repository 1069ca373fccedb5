"""Steps through Hydra's pages that several browser journeys take the same way."""

from __future__ import annotations

import re
from pathlib import Path


def upload_dataset(page, path: Path, name: str, *, vocab_size: int | None = None, ready_s: float = 120) -> None:
    """Upload `path` through the dataset form as `name` and wait on its page until the web worker has built it
    (the page reloads itself until then)."""
    page.click("nav.mainnav >> text=Datasets")
    page.check("input[name=source][value=upload]")
    page.set_input_files("input[name=file]", str(path))
    page.fill("input[name=name]", name)
    if vocab_size is not None:
        page.fill("input[name=vocab_size]", str(vocab_size))
    page.click("#dataset-form button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/\d+/$"), timeout=60_000)
    page.wait_for_selector("#dataset-status[data-status=ready]", timeout=ready_s * 1000)
