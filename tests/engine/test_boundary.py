"""The engine imports no Django, Celery or Redis: dependencies point one way, web -> worker -> engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BLOCKED_IMPORT = textwrap.dedent("""
    import importlib, pkgutil, sys

    BLOCKED = {"django", "celery", "redis", "kombu", "webapp"}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"the engine must not import {name}")
            return None

    sys.meta_path.insert(0, Blocker())
    import worker.engine
    for module in pkgutil.walk_packages(worker.engine.__path__, "worker.engine."):
        importlib.import_module(module.name)
    print("ok")
""")


def test_it_imports_without_django_celery_or_redis() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], capture_output=True, text=True,
                            cwd=Path(__file__).parents[2], timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
