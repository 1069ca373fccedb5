"""A Redis database of its own for each test process when pytest-xdist runs the tests in several.

Tests share one Redis server. Hosts register in a lab-wide registry and the web app places trials on any live
host there, so two test processes on one database would place each other's trials. Each xdist worker
(``PYTEST_XDIST_WORKER`` = ``gw0``, ``gw1``...) therefore moves ``REDIS_URL`` to database ``base + 1 + n``
before Django's settings read it: loaded with ``-p`` (see pyproject.toml), this module runs before pytest-django
sets Django up. A run without xdist keeps ``REDIS_URL`` as it is.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # redis-server's default `databases`


def worker_redis_url(url: str, worker: str) -> str:
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    database = base + 1 + int(worker.removeprefix("gw"))
    if database >= REDIS_DATABASES:
        raise SystemExit(f"REDIS_URL={url!r}: test process {worker} would need Redis database {database}; "
                         f"the server has {REDIS_DATABASES} (use a lower database or fewer processes)")
    return urlunsplit(parts._replace(path=f"/{database}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    os.environ["REDIS_URL"] = worker_redis_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), _worker)
