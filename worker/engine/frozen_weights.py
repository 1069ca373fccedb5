"""A low-bit frozen base on the device: each weight dequantized just before the module that reads it runs.

A unit of a LoRA trial on a ``bf16``, ``int8`` or ``nf4`` base (:mod:`worker.engine.base_formats`) holds its
shard's frozen weights on the device as the base stores them. :func:`dequantized_on_use` makes each of them
full precision only while the module that reads it computes: a forward pre-hook dequantizes the module's
frozen weights and binds them, and its forward hook binds placeholders again, so nothing but autograd keeps
them. Autograd would: a linear layer saves its weight for the gradient of its input. So within the module's
forward a saved weight is packed as a reference to its stored form and dequantized again when backward unpacks
it (as bitsandbytes' 4-bit matmul dequantizes again in its backward). A full-precision weight thus exists for
one module's forward, or one module's backward, at a time.

The full precision is the trial's compute dtype for a weight a matmul reads (bf16 under autocast, where the
matmul would cast it anyway, else fp32) and fp32 for the rest (embeddings, norm weights, biases), as plain
PyTorch with an fp32 copy of the same values computes. An embedding dequantizes only the rows of the tokens it
looks up (:func:`worker.engine.base_formats.dequantize_rows`): the rest of a vocabulary is never read. A module
"reads" its own weights, but for a head whose loss runs in token chunks (:mod:`worker.engine.chunked_loss`),
which reads its ``lm_head`` weight itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from worker.engine.base_formats import dequantize, dequantize_rows
from worker.engine.head import CausalLMHead
from worker.engine.layers import FrozenRef, LayerStack


def _reader(layer: nn.Module, ref: FrozenRef) -> nn.Module:
    """The module whose forward reads frozen weight ``ref`` of ``layer``."""
    module = layer.get_submodule(ref.name.rpartition(".")[0])
    if isinstance(layer, CausalLMHead) and module is layer.lm_head and layer.token_chunk is not None \
            and layer.chunkable:
        return layer
    return module


def _readers(stack: LayerStack, index: int, compute_dtype: torch.dtype
             ) -> list[tuple[nn.Module, list[tuple[FrozenRef, torch.dtype]]]]:
    """Layer ``index``'s modules that read frozen weights, each with its weights and their full precision."""
    layer = stack.layers[index]
    readers: dict[int, tuple[nn.Module, list[tuple[FrozenRef, torch.dtype]]]] = {}
    for ref in stack.frozen[index]:
        module = _reader(layer, ref)
        matmul = not isinstance(module, nn.Embedding) and len(ref.shape) == 2
        readers.setdefault(id(module), (module, []))[1].append((ref, compute_dtype if matmul else torch.float32))
    return list(readers.values())


def dequantized_bytes(stack: LayerStack, index: int, compute_dtype: torch.dtype) -> int:
    """The most bytes of full-precision frozen weights layer ``index`` holds at once under
    :func:`dequantized_on_use`: those of its module with the most (a module's forward or backward at a time)."""
    return max((sum(ref.numel * (torch.finfo(dtype).bits // 8) for ref, dtype in plan)
                for _, plan in _readers(stack, index, compute_dtype)), default=0)


@contextlib.contextmanager
def dequantized_on_use(stack: LayerStack, first: int, stop: int, stored: dict[int, dict[str, torch.Tensor]],
                       formats: dict[str, str], compute_dtype: torch.dtype) -> Iterator[None]:
    """Within the block, layers ``[first, stop)`` of ``stack`` dequantize their frozen weights from ``stored``
    (layer -> the base's parts on the device, :meth:`worker.engine.shared_base.BaseCache.layers`; ``formats``:
    checkpoint name -> the precision the base stores it at) as each module that reads them runs, and autograd
    keeps references to the stored parts in their place."""
    live: dict[int, tuple[int, FrozenRef, torch.dtype]] = {}  # storage data_ptr -> (layer, weight, dtype)
    entered: list[Any] = []  # the saved-tensor hooks of the modules running now, innermost last
    handles = []

    def full(index: int, ref: FrozenRef, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(stored[index], ref.key, ref.shape, formats[ref.key], dtype)

    def pack(t: torch.Tensor) -> Any:
        found = live.get(t.untyped_storage().data_ptr())
        if found is None:
            return t
        return (*found, t.storage_offset(), tuple(t.shape), t.stride())

    def unpack(saved: Any) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        index, ref, dtype, offset, shape, stride = saved
        return torch.as_strided(full(index, ref, dtype), shape, stride, offset)

    try:
        for index in range(first, stop):
            for module, plan in _readers(stack, index, compute_dtype):

                def bind(module: nn.Module, args: Any, index: int = index, plan: list = plan) -> None:
                    for ref, dtype in plan:
                        if isinstance(module, nn.Embedding) and args:
                            # A lookup reads only its tokens' rows (and backward, the token ids alone).
                            weight = dequantize_rows(stored[index], ref.key, ref.shape, formats[ref.key], args[0],
                                                     dtype)
                        else:
                            weight = full(index, ref, dtype)
                        live[weight.untyped_storage().data_ptr()] = (index, ref, dtype)
                        stack.bind(index, ref.name, weight, trainable=False)
                    hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
                    hooks.__enter__()
                    entered.append(hooks)

                def unbind(_module: nn.Module, _args: Any, _out: Any, index: int = index, plan: list = plan) -> None:
                    entered.pop().__exit__(None, None, None)
                    for ref, _ in plan:
                        weight = stack.layers[index].get_parameter(ref.name)
                        live.pop(weight.untyped_storage().data_ptr(), None)
                        stack.bind(index, ref.name, torch.empty(ref.shape, device="meta"), trainable=False)

                handles.append(module.register_forward_pre_hook(bind))
                handles.append(module.register_forward_hook(unbind))
        yield
    finally:
        while entered:  # a module's forward raised: its hooks never left
            entered.pop().__exit__(None, None, None)
        for handle in handles:
            handle.remove()
        for index in range(first, stop):  # placeholders again, also where a forward raised before unbinding
            for ref in stack.frozen[index]:
                stack.bind(index, ref.name, torch.empty(ref.shape, device="meta"), trainable=False)
