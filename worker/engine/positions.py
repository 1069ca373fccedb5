"""The position ids of the batch a model's layers run on, shared by every layer of a stack.

A model's own forward computes position ids once and hands them to each of its layers; a layer of a stack
runs alone (in its shard's unit), so the unit sets them here before it runs a shard. Rows of one sequence
each need none (``ids`` is None: positions 0..T-1, the default of the model's forward). Rows of packed
examples carry ids that restart at each example's first token, from which the model's mask functions keep
each example's attention to itself (``transformers.masking_utils`` detects packed rows from them).
"""

from __future__ import annotations

import torch


class Positions:
    """Position ids for the stack's layers; see the module docstring."""

    def __init__(self) -> None:
        self.ids: torch.Tensor | None = None  # (B, T) int64 on the layers' device, or None

    def of(self, hidden: torch.Tensor) -> torch.Tensor:
        """The position ids of `hidden` (B, T, ...): (B, T) when set, else (1, T) counting from 0."""
        if self.ids is None:
            return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)  # (1, T)
        return self.ids
