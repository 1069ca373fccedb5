"""Forward graphs kept in host memory from a forward unit to the matching backward unit.

A kept graph holds no device memory between the two units: saved activations go to host memory (on CUDA
they are copied off the device), saved weights are kept as references into the shard's flat parameter
buffer and re-pointed at the buffer the backward unit reloads, and the input leaf, the output and the
Parameters keep only their identity. Backpropagating through the restored graph computes what the
original forward's graph would have: the same saved values, the same weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from worker.engine.layout import Slot


@dataclass
class KeptGraph:
    """A forward unit's autograd graph, kept in this process for the matching backward unit.

    ``params`` is the shard's flat parameter buffer as reloaded by the backward unit (:meth:`restore`).
    """

    out: torch.Tensor
    x: torch.Tensor
    owned: list[nn.Parameter]
    params: torch.Tensor | None = None
    weights_saved: bool = False  # whether backward reads any of the shard's weights

    def restore(self, params: torch.Tensor, slots: Sequence[Slot], shape: Sequence[int], device: torch.device
                ) -> None:
        """Make the graph ready for backward: its weights views of ``params`` (the shard's reloaded flat
        parameters, laid out as ``slots``), its input and output device tensors of ``shape``."""
        self.params = params
        for slot, param in zip(slots, self.owned, strict=True):
            param.data = slot.view(params)
        if self.x.is_floating_point():  # shard 0's input is token ids, never differentiated
            self.x.data = torch.empty(*shape, device=device)
        self.out.data = torch.empty(*shape, device=device, dtype=self.out.dtype)


def forward_kept(run: Callable[[torch.Tensor], tuple[torch.Tensor, list[nn.Parameter]]], params: torch.Tensor,
                 x: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, KeptGraph]:
    """Run ``run(x)`` (a shard's forward with weights bound as views of ``params``; it returns the output
    and the owned Parameters) with a graph whose saved tensors are offloaded by reference; return a copy of
    the output and the kept graph."""
    x = x.detach().requires_grad_(x.is_floating_point())
    weights = params.untyped_storage().data_ptr()
    kept = KeptGraph(out=x, x=x, owned=[])
    on_cpu = device.type == "cpu"

    def pack(t: torch.Tensor) -> tuple[Any, ...]:
        if t.untyped_storage().data_ptr() == weights:
            kept.weights_saved = True
            return ("weight", t.storage_offset(), tuple(t.shape), t.stride())
        # detach(): an alias, so that emptying the input leaf or output below does not empty it
        return ("activation", t.detach() if on_cpu else t.to("cpu", non_blocking=True))

    def unpack(handle: tuple[Any, ...]) -> torch.Tensor:
        if handle[0] == "weight":
            assert kept.params is not None, "the backward unit re-points weights before backward"
            return torch.as_strided(kept.params, handle[2], handle[3], handle[1])
        return handle[1] if on_cpu else handle[1].to(device, non_blocking=True)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        kept.out, kept.owned = run(x)
    out = kept.out.detach().clone()
    # Keep only the graph: what backward reads went through pack; the input leaf, the output and the
    # weights are needed for their identity and shape alone, so drop their device memory.
    for tensor in (*kept.owned, kept.x, kept.out):
        tensor.data = torch.empty(0, device=device, dtype=tensor.dtype)
    return out, kept


class SavedStorage:
    """Whether autograd saved a tensor of one storage for backward (see :func:`saves_storage`)."""

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.data_ptr = storage.data_ptr()
        self.seen = False

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() == self.data_ptr:
            self.seen = True
        return t


@contextlib.contextmanager
def saves_storage(tensor: torch.Tensor) -> Iterator[SavedStorage]:
    """Within the block, record whether autograd saves for backward any tensor that shares ``tensor``'s storage
    (a shard's flat parameters: whether its backward needs the weights' values)."""
    saved = SavedStorage(tensor.untyped_storage())
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        yield saved
