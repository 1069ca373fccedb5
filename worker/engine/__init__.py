"""Hydra's engine: exact shard-parallel, spilled training of one trial (pure PyTorch; see docs/engine.md).

The scheduler's entry points are :func:`trial_create` and :class:`TrialSession`; ``train_trial`` runs a
whole trial in one process.

Names are resolved lazily (PEP 562): the web process imports the torch-free modules (``config``,
``partition``, ``errors``, ``schedule``, ``sizes``) for its memory preview without loading torch and
transformers.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

# bitsandbytes' CPU backend (imported by peft) asks the `kernels` package, when it is first imported, for an
# optional matmul kernel from the Hugging Face Hub, and both warn when they cannot have it. Hydra's processes never
# reach a hub (HF_HUB_OFFLINE), and its CPU path dequantizes a low-bit base in plain PyTorch, which needs no such
# kernel: the warnings would say nothing to its users.
for _name in ("bitsandbytes.backends.cpu.ops", "kernels"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_EXPORTS = {
    "DataSpec": "config",
    "DpoSpec": "config",
    "ModelSpec": "config",
    "OptimizerSpec": "config",
    "ScheduleSpec": "config",
    "TrialSpec": "config",
    "BudgetError": "errors",
    "EngineError": "errors",
    "SpecError": "errors",
    "SpillStoreError": "errors",
    "StaleWriterError": "errors",
    "LayerCost": "partition",
    "MemoryPlan": "partition",
    "ShardPlan": "partition",
    "UnitSpec": "schedule",
    "FP32": "sizes",
    "optimizer_slots": "sizes",
    "TrialSession": "session",
    "UnitResult": "session",
    "TrialState": "trial_state",
    "trial_create": "create",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"worker.engine.{module}"), name)
