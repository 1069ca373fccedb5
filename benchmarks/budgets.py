"""The smallest memory budget the engine's planner fits a trial into, for benchmarks whose model has one layer
too large for the budget they would choose (a tied embedding of a large vocabulary)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import torch

from worker.engine import TrialSpec
from worker.engine.errors import BudgetError
from worker.engine.train import train_trial


def fitting_spec(spec: TrialSpec, spill_dir: Path, device: torch.device, *, step_bytes: int) -> TrialSpec:
    """``spec`` with the smallest budget from its own up that the engine's planner fits (one step trained to
    find out, its store removed): the bytes the layer at fault needs when the planner names them, else
    ``step_bytes`` more."""
    while True:
        try:
            train_trial(spec=dataclasses.replace(spec, steps=1), spill_dir=spill_dir, trial_id="fitting-budget",
                        device=device)
            return spec
        except BudgetError as error:
            print(f"budget {spec.budget_bytes} does not fit ({error}); trying a larger one", file=sys.stderr)
            needed = error.needed_bytes or spec.budget_bytes + step_bytes
            spec = dataclasses.replace(spec, budget_bytes=max(needed, spec.budget_bytes + 1))
        finally:
            shutil.rmtree(spill_dir / "fitting-budget", ignore_errors=True)
