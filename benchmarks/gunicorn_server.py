"""The web app served by gunicorn for the HTTP benchmarks (`dashboard_load.py`, `web_scale.py`).

Nothing here imports Django: a benchmark that picks its database before `django.setup()` can import it first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(port: int) -> subprocess.Popen[bytes]:
    """gunicorn serving the web app on `port` with production settings (DEBUG off, plain HTTP on loopback, the
    static files collected first), once it listens; the environment (database, Redis, SECRET_KEY) is this
    process's."""
    env = {**os.environ, "DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1", "HYDRA_HTTPS": "0"}
    # As a deployment does before it serves: the pages name the static files by their collected, hashed names.
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], env=env, cwd=ROOT,
                   check=True)
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "webapp.wsgi", "--bind", f"127.0.0.1:{port}",
                               "--workers", "1", "--log-level", "warning"], env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"gunicorn exited with {server.returncode}") from None
            time.sleep(0.2)
    server.kill()
    raise SystemExit("gunicorn did not start listening within 60 s")
