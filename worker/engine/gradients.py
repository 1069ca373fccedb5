"""A shard's gradients accumulated over micro-batches, and a step's global gradient norm, with autograd's
and ``clip_grad_norm_``'s own arithmetic.

Accumulation adds each micro-batch's gradient to the sum so far, in micro-batch order, as autograd
accumulates ``.grad``; a tied weight's gradient is the sum of its uses before it is accumulated, as autograd
sums them. All of it is elementwise, so it streams: the sum so far is read from the store, added to and
written back ``GRAD_CHUNK`` elements at a time, and a borrower's contribution is added in place in chunks;
the device never holds a second gradient-sized buffer beside the fresh gradients. The global norm is the L2
norm of the per-parameter L2 norms in model parameter order, as ``torch.nn.utils.clip_grad_norm_`` computes
it, each parameter's norm taken over its whole accumulated gradient as the last micro-batch leaves it in memory.

A micro-batch of a gathered step (a model of one shard, see :class:`~worker.engine.schedule.Segment`) that starts
before the ones ahead of it are in the sum *parks* its gradient in a buffer of its own; the next micro-batch to
find every one ahead of it committed adds the parked ones, in micro-batch order, before its own, and the step's
``S`` unit adds those still parked at its end (the last of them read back as the fresh gradient) and applies
the update from that sum in memory, without staging it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from worker.engine.layout import Layout, Slot
from worker.engine.optimizer_step import read_chunk
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers

GRAD_CHUNK = 1 << 20  # elements of an accumulated gradient or a tied contribution on the device at once


def with_tied(store: SpillStore, layout: Layout, shard: int, owned: Sequence[nn.Parameter], device: torch.device,
              *, micro_batch: int) -> list[torch.Tensor]:
    """The gradients of ``shard``'s owned parameters from this backward of ``micro_batch``, each tied weight's
    with what the shards that borrow it left for that micro-batch in their ``t`` buffers added in place (a chunk
    of the contribution at a time); the buffers are dropped, read for the last time."""
    fresh = [cast(torch.Tensor, p.grad) for p in owned]  # every owned parameter took part in the backward
    slot_index = {slot.ref: i for i, slot in enumerate(layout.slots[shard])}
    for slot, borrower, offset in layout.incoming(shard):
        grad = fresh[slot_index[slot.ref]]
        assert grad.is_contiguous(), "autograd lays a gradient out like its (contiguous) parameter"
        flat = grad.view(-1)
        for start in range(0, slot.ref.numel, GRAD_CHUNK):
            stop = min(slot.ref.numel, start + GRAD_CHUNK)
            contribution = store.read_new(f"t{micro_batch}.{borrower}", stop - start, torch.float32,
                                          offset=(offset + start) * FP32)
            # Autograd would sum both uses of the tied weight before accumulating: do the same.
            flat[start:stop].add_(contribution.to(device))
    for borrower in sorted({borrower for _, borrower, _ in layout.incoming(shard)}):
        # read for the last time once every weight it holds a contribution to is this shard's
        if all(layout.by_ref[borrow.owner].shard == shard for borrow, _ in layout.lent[borrower]):
            store.drop(f"t{micro_batch}.{borrower}")
    return fresh


def accumulate(store: SpillStore, transfers: Transfers, name: str, slots: Sequence[Slot], fresh: list[torch.Tensor],
               owned: Sequence[nn.Parameter] | None, *, partial: bool, norms: bool = False,
               parked: Sequence[str] = (), stage: bool = True) -> list[float] | None:
    """Stage the shard's flat gradient buffer ``name``: ``fresh`` added to the sum so far (or, unless
    ``partial``, ``fresh`` itself), a chunk at a time; clear the parameters' ``.grad`` (``owned``; None: ``fresh``
    was read back from the store, not left by a backward) and empty ``fresh``
    as each is written, so that its memory goes as soon as it is in the store. ``parked``: buffers of the
    micro-batches between the sum so far and this one (each staged here by its own micro-batch, without
    ``partial``), added to the sum in their order first. Without ``stage`` the sum is only made, in ``fresh``'s
    memory, for a caller that holds another reference to it and uses it at once (the step's update).

    The sum so far is added into the fresh gradient, chunk by chunk: IEEE addition commutes exactly, so
    ``fresh + old`` has the bits of autograd's ``old + new``, and the parameter's whole accumulated gradient is
    in memory once its last chunk is added. With ``norms`` (the step's last micro-batch) return the L2 norm of
    each parameter's accumulated gradient, taken there before the memory goes.
    """
    assert partial or not parked, "a parked gradient follows a micro-batch already in the sum"
    measured = []
    writer = store.writer(name, nbytes=sum(slot.ref.numel for slot in slots) * FP32) if stage else None
    with contextlib.nullcontext() if writer is None else writer as append:
        for index, (slot, param) in enumerate(zip(slots, owned if owned is not None else [None] * len(slots),
                                                  strict=True)):
            grad = fresh[index].reshape(-1)
            fresh[index] = torch.empty(0)  # ``grad`` and ``param.grad`` are its last references
            for start in range(0, slot.ref.numel, GRAD_CHUNK):
                stop = min(slot.ref.numel, start + GRAD_CHUNK)
                piece = grad[start:stop]
                if partial:  # old + new, as autograd accumulates .grad
                    # The buffer's committed version: the one being written is registered when it is complete.
                    old = read_chunk(store, transfers, name, slot.offset + start, slot.offset + stop)
                    for waiting in parked:  # ((old + h1) + h2) ..., as the micro-batches would have added them
                        old.add_(read_chunk(store, transfers, waiting, slot.offset + start, slot.offset + stop))
                    piece.add_(old)
                    del old
                if append is not None:
                    append(piece)
                del piece
            if norms:
                measured.append(torch.linalg.vector_norm(grad, 2.0).item())
            if param is not None:
                param.grad = None
            del grad
    return measured if norms else None


def global_norm(norms: Sequence[float]) -> float:
    """The L2 norm of the per-parameter norms ``norms`` (in model parameter order), in fp32."""
    return torch.linalg.vector_norm(torch.tensor(norms, dtype=torch.float32), 2.0).item()
