"""Hydra's engine: exact shard-parallel, spilled training of one trial (pure PyTorch; see docs/engine.md).

The scheduler's entry points are :func:`trial_create` and :class:`TrialSession`; ``train_trial`` runs a
whole trial in one process.
"""

from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.errors import BudgetError, EngineError, SpecError, SpillStoreError
from worker.engine.partition import LayerCost, MemoryPlan, ShardPlan
from worker.engine.schedule import UnitSpec
from worker.engine.session import TrialSession, UnitResult, trial_create

__all__ = [
    "BudgetError",
    "DataSpec",
    "EngineError",
    "LayerCost",
    "MemoryPlan",
    "ModelSpec",
    "OptimizerSpec",
    "ScheduleSpec",
    "ShardPlan",
    "SpecError",
    "SpillStoreError",
    "TrialSession",
    "TrialSpec",
    "UnitResult",
    "UnitSpec",
    "trial_create",
]
