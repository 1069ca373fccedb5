"""Headless Debian Chromium through Playwright (never a downloaded browser), a screenshot folder, and the
whole stack as `make run` starts it (`devstack`).

Screenshots go to ``$HYDRA_ARTIFACTS_DIR/screenshots`` when the test environment sets it (CI keeps that
folder), else ``artifacts/screenshots``; every test prints the paths it saved.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

from tests.browser.devstack import DevStack

# Playwright's sync API runs an event loop in the test thread; the ORM calls the tests make there are
# ordinary synchronous ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

COLLECTED_AT = time.time()  # screenshots newer than this belong to this run
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]


def require_chromium(chromium: Path, environ: Mapping[str, str]) -> None:
    """Skip the browser tests when `chromium` is missing, but fail them in CI (``CI`` set, as CI services and
    ``.ci/run`` do), where a missing browser must not pass as a green run."""
    if chromium.exists():
        return
    message = f"no Chromium at {chromium} (apt-get install chromium)"
    if environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{message}; CI={environ['CI']} requires the browser tests to run", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    require_chromium(Path(CHROMIUM), os.environ)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def screenshots_root() -> Path:
    root = Path(os.environ.get("HYDRA_ARTIFACTS_DIR") or Path(__file__).resolve().parents[2] / "artifacts")
    return root / "screenshots"


@pytest.fixture
def screenshots_dir() -> Path:
    path = screenshots_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List this run's screenshots in the log even when pytest captured the tests' own prints."""
    shots = sorted(p for p in screenshots_root().glob("*.png") if p.stat().st_mtime >= COLLECTED_AT)
    if shots:
        terminalreporter.section("browser screenshots")
        for shot in shots:
            terminalreporter.write_line(str(shot))


@pytest.fixture
def page(browser) -> Iterator[object]:
    """A fresh page whose console errors and uncaught exceptions are collected in ``page.errors``.

    Each entry names the page it happened on: ``"<url>: <message>"``.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("console",
            lambda message: page.errors.append(f"{page.url}: {message.text}") if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(f"{page.url}: {error}"))
    yield page
    context.close()


@pytest.fixture
def db_lock(monkeypatch) -> threading.Lock:
    """Hold it while the test writes to the database: `live_server` requests wait for it, one at a time.

    With SQLite in memory, `live_server`'s thread shares the test's connection; a request that reads while
    the test writes fails with "database table is locked" (a 500 the page logs as a console error).
    """
    lock = threading.Lock()
    handle = WSGIHandler.__call__

    def one_at_a_time(self: WSGIHandler, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with lock:
            return handle(self, environ, start_response)

    monkeypatch.setattr(WSGIHandler, "__call__", one_at_a_time)
    return lock


@pytest.fixture
def devstack(tmp_path: Path) -> Iterator[DevStack]:
    """The whole product as ``make run`` starts it (web, a worker per CPU device, ingest), on a free port.

    It has its own data and spill folders and host id, shares the session's Redis, and is stopped with Ctrl-C
    (SIGINT) after the test, which then fails if any process it started is still running. Each journey has a
    stack of its own: on a shared one, the web worker's work left by one journey (held-out answers of a
    SmolLM2 sweep) slows the next journey's trials past what its checks wait for.
    """
    stack = DevStack(root=tmp_path / "stack", worker_config=settings.HYDRA.worker)
    stack.root.mkdir()
    try:
        stack.start()
        yield stack
    finally:
        print(f"queue of the stack's host, as the test ended:\n{stack.queue_state()}")
        left = stack.stop()
        print(f"devstack log: {stack.log_path}")
    assert left == [], f"still running after Ctrl-C: {left}\n{stack.log()}"


from tests.webapp.experiments.conftest import scheduler  # noqa: E402, F401 -- fixtures
from tests.webapp.telemetry.conftest import data_dir, host_id  # noqa: E402, F401
