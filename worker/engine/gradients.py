"""A shard's gradients accumulated over micro-batches, and a step's global gradient norm, with autograd's
and ``clip_grad_norm_``'s own arithmetic.

Accumulation adds each micro-batch's gradient to the sum so far in place, in micro-batch order, as
autograd accumulates ``.grad``; a tied weight's gradient is the sum of its uses before it is accumulated,
as autograd sums them. The global norm is the L2 norm of the per-parameter L2 norms in model parameter
order, as ``torch.nn.utils.clip_grad_norm_`` computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from worker.engine.layout import Layout, Slot
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore


def with_tied(store: SpillStore, layout: Layout, shard: int, owned: Sequence[nn.Parameter], device: torch.device
              ) -> list[torch.Tensor]:
    """The gradients of ``shard``'s owned parameters from this backward, each tied weight's plus what the
    shards that borrow it left in their ``t`` buffers."""
    fresh = [cast(torch.Tensor, p.grad) for p in owned]  # every owned parameter took part in the backward
    slot_index = {slot.ref: i for i, slot in enumerate(layout.slots[shard])}
    for slot, borrower, offset in layout.incoming(shard):
        contribution = store.read_new(f"t{borrower}", slot.ref.numel, torch.float32, offset=offset * FP32)
        i = slot_index[slot.ref]
        # Autograd would sum both uses of the tied weight before accumulating: do the same.
        fresh[i] = fresh[i] + contribution.view(slot.ref.shape).to(device)
    return fresh


def accumulate(flat: torch.Tensor, slots: Sequence[Slot], fresh: Sequence[torch.Tensor],
               owned: Sequence[nn.Parameter], *, partial: bool) -> None:
    """Add ``fresh`` into the shard's flat gradient buffer ``flat`` (or, unless ``partial``, start it
    with them) and clear the parameters' ``.grad``."""
    for slot, grad, param in zip(slots, fresh, owned, strict=True):
        target = flat[slot.offset:slot.offset + slot.ref.numel]
        if partial:
            target.add_(grad.view(-1))  # old + new, in place, as autograd accumulates .grad
        else:
            target.copy_(grad.view(-1))
        param.grad = None


def parameter_norms(flat: torch.Tensor, slots: Sequence[Slot]) -> list[float]:
    """The L2 norm of each parameter's gradient in the shard's flat gradient buffer ``flat``."""
    return [torch.linalg.vector_norm(flat[s.offset:s.offset + s.ref.numel], 2.0).item() for s in slots]


def global_norm(norms: Sequence[float]) -> float:
    """The L2 norm of the per-parameter norms ``norms`` (in model parameter order), in fp32."""
    return torch.linalg.vector_norm(torch.tensor(norms, dtype=torch.float32), 2.0).item()
