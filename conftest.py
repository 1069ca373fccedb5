"""Test-wide defaults. Tests run Hydra in development mode unless the caller says otherwise."""

import os

os.environ.setdefault("DEBUG", "1")
