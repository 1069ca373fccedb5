"""Where every parameter of a trial lives in its shards' flat fp32 buffers.

A shard's buffer is its layers' owned parameters laid end to end, in layer order and, within a layer, in
the order :class:`~worker.engine.layers.LayerStack` lists them; so the concatenation of every shard's
buffer is the same vector for any plan. A tied weight is owned by one layer and borrowed by others; when
the borrower sits in another shard, its gradient travels through the borrower's ``t`` buffer (see
:mod:`worker.engine.session`), at the offset :attr:`Layout.lent` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from worker.engine.layers import Borrow, LayerStack, ParamRef
from worker.engine.partition import MemoryPlan


@dataclass(frozen=True)
class Slot:
    """An owned parameter at element ``offset`` of its shard's flat buffers."""

    ref: ParamRef
    shard: int
    offset: int

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        """The parameter as a view of its shard's flat buffer ``flat``, in the parameter's shape."""
        return flat[self.offset:self.offset + self.ref.numel].view(self.ref.shape)


class Layout:
    """Where every parameter lives: flat offsets per shard, and the cross-shard borrows (tied weights)."""

    def __init__(self, stack: LayerStack, plan: MemoryPlan) -> None:
        self.shard_of_layer = [s.index for s in plan.shards for _ in range(s.first, s.stop)]
        self.slots: list[list[Slot]] = []
        self.by_ref: dict[ParamRef, Slot] = {}
        for shard in plan.shards:
            offset, slots = 0, []
            for index in range(shard.first, shard.stop):
                for ref in stack.owned[index]:
                    slot = Slot(ref, shard.index, offset)
                    slots.append(slot)
                    self.by_ref[ref] = slot
                    offset += ref.numel
            self.slots.append(slots)
        self.numel = [sum(slot.ref.numel for slot in slots) for slots in self.slots]
        # (borrow, element offset in t{borrowing shard}) for borrows whose owner sits in another shard
        self.lent: list[list[tuple[Borrow, int]]] = []
        for shard in plan.shards:
            offset, lent = 0, []
            for index in range(shard.first, shard.stop):
                for borrow in stack.borrowed[index]:
                    if self.by_ref[borrow.owner].shard != shard.index:
                        lent.append((borrow, offset))
                        offset += borrow.owner.numel
            self.lent.append(lent)

    def incoming(self, shard: int) -> Iterator[tuple[Slot, int, int]]:
        """(owned slot, borrowing shard, offset in its t buffer) for borrows of ``shard``'s parameters."""
        for borrower, lent in enumerate(self.lent):
            for borrow, offset in lent:
                slot = self.by_ref[borrow.owner]
                if slot.shard == shard:
                    yield slot, borrower, offset
