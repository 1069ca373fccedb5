"""Test-wide defaults. Tests run Hydra in development mode unless the caller says otherwise."""

import os

os.environ.setdefault("DEBUG", "1")
# Nothing reaches a model hub, in the tests as in Hydra's own processes (scripts/devstack.py, the Dockerfile).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
