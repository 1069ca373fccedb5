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
from worker.engine.layers import build_layer_stack
from worker.engine.partition import solve
from worker.engine.profile import profile_layers
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


def whole_head_spec(spec: TrialSpec, device: torch.device) -> TrialSpec:
    """``spec`` with the smallest budget from its own up at which the planner keeps the head's logits whole (it
    computes the head's loss in token chunks, which costs compute, only when the whole head does not fit)."""
    stack = build_layer_stack(spec.model, spec.lora)
    costs = profile_layers(stack, spec, device)
    budget = spec.budget_bytes
    while True:
        try:
            solve(costs, budget)
            return dataclasses.replace(spec, budget_bytes=budget)
        except BudgetError as error:
            budget = max(error.needed_bytes or budget + 1, budget + 1)
