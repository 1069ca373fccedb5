"""Dependencies point one way, web -> worker -> engine, and nothing imports in a circle.

- The engine imports no Django, Celery or Redis (nor the web app).
- The workers run without Django: every `worker` module outside the engine imports with Django blocked,
  and ``python -m worker.launch`` gets as far as choosing its devices.
- The web process imports no torch at import time: every `webapp` module imports with torch blocked.
- One `webapp` module imports `worker`: the door (`webapp.worker_door`), which names everything the web app
  uses of the workers' code (the contract, the queue's operations, the workers' configuration, the engine's
  torch-free pieces) and imports the engine's code that loads torch or transformers only when it is first
  used.
- The web app is layered: each of its modules imports only modules of its own app and of the apps below it in
  `WEB_LAYERS`, at module level or inside a function alike. The shared modules come first (the door, the small
  helpers, the configuration, the queue client), then the apps, the ground (the records of experiments and
  trials every app reads) low among them and the experiments app, which drives the others, at the top; the
  project's wiring (settings, URLs, WSGI) stands above them all.
- No import cycle anywhere: a walk over every import statement of the tree, at module level or inside a
  function alike.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("webapp", "worker")
WEB_DOORS_TO_WORKER = {"webapp.worker_door"}
# The web app's parts, bottom first: a module of `webapp.<part>` (the part's package or module) imports only its
# own part and those before it.
WEB_LAYERS = (
    "worker_door", "allowlist", "ids", "paging", "csv_cells", "nul_text", "config", "queue_client",
    "accounts", "background", "ground", "datasets", "health", "catalog", "telemetry", "leaderboards",
    "notifications", "dashboards", "labqueue", "experiments", "api",
    "settings", "urls", "wsgi",
)

BLOCKER = textwrap.dedent("""
    import importlib, pkgutil, sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} must not be imported here")
            return None

    sys.meta_path.insert(0, Blocker())
""")


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=180,
                          env=env)


def test_the_engine_imports_without_django_celery_or_redis() -> None:
    code = "BLOCKED = {'django', 'celery', 'redis', 'kombu', 'webapp'}\n" + BLOCKER + textwrap.dedent("""
        import worker.engine
        for module in pkgutil.walk_packages(worker.engine.__path__, "worker.engine."):
            importlib.import_module(module.name)
        print("ok")
    """)
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_workers_import_without_django() -> None:
    code = "BLOCKED = {'django', 'webapp'}\n" + BLOCKER + textwrap.dedent("""
        import worker
        for module in pkgutil.walk_packages(worker.__path__, "worker."):
            if not module.name.startswith("worker.engine"):
                importlib.import_module(module.name)
        print("ok")
    """)
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_launcher_reads_its_own_configuration_without_django(tmp_path: Path) -> None:
    code = "BLOCKED = {'django', 'webapp'}\n" + BLOCKER + textwrap.dedent("""
        import runpy
        sys.argv = ["python -m worker.launch", "--device", "cpu:7"]
        runpy.run_module("worker.launch", run_name="__main__")
    """)
    env = {"PATH": "/usr/bin:/bin", "HYDRA_DEVICES": "cpu:2", "HYDRA_DATA_DIR": str(tmp_path)}
    result = _run(code, env)
    # It chose this host's two CPU devices from HYDRA_DEVICES, and refused the one asked for by name.
    assert result.returncode == 2, result.stderr
    assert "--device cpu:7 is not one of this host's devices: ['cpu:0', 'cpu:1']" in result.stderr
    bad = _run(code, {**env, "HYDRA_DEVICES": "gpu"})
    assert bad.returncode == 2 and "HYDRA_DEVICES='gpu' is not understood" in bad.stderr


def test_the_web_app_imports_no_torch() -> None:
    code = "BLOCKED = {'torch', 'transformers', 'safetensors'}\n" + BLOCKER + textwrap.dedent("""
        import os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
        os.environ.setdefault("DEBUG", "1")
        import django
        django.setup()
        import webapp
        for module in pkgutil.walk_packages(webapp.__path__, "webapp."):
            importlib.import_module(module.name)
        print("ok")
    """)
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The project modules `name` imports, wherever in the file the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imports(name, path, set(modules))) for name, path in modules.items()}


def test_only_the_door_of_the_web_app_imports_the_workers() -> None:
    graph = _graph()
    importers = {name for name, targets in graph.items()
                 if name.startswith("webapp") and any(t.split(".")[0] == "worker" for t in targets)}
    assert importers == WEB_DOORS_TO_WORKER


def test_every_part_of_the_web_app_is_in_its_layers() -> None:
    parts = {name.split(".")[1] for name in _modules() if name.startswith("webapp.")}
    assert parts == set(WEB_LAYERS)


def test_the_web_app_imports_only_downwards() -> None:
    rank = {part: index for index, part in enumerate(WEB_LAYERS)}
    upwards = sorted(
        f"{name} -> {target}"
        for name, targets in _graph().items() if name.startswith("webapp.")
        for target in targets if target.startswith("webapp.")
        if rank[target.split(".")[1]] > rank[name.split(".")[1]]
    )
    assert upwards == []


def test_nothing_imports_in_a_circle() -> None:
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            # A package's __init__ that a submodule imports is not a cycle through that submodule's own file.
            if module.startswith(target + "."):
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []
