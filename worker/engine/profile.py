"""Measure each layer's bytes and time for a trial's micro-batch, one materialized layer at a time, and plan the
trial's shards from them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from worker.engine.config import TrialSpec
from worker.engine.frozen_weights import dequantized_bytes
from worker.engine.head import CausalLMHead
from worker.engine.layers import LayerStack
from worker.engine.partition import LayerCost, MemoryPlan, choose_kept, plan_with_shards, solve, solve_with_head_chunks
from worker.engine.sizes import FP32, chunked_head_transient_bytes, optimizer_slots, stored_bytes
from worker.engine.weights import init_layer

MEASURED_ALIKE = 2  # layers of one kind measured; the others of the kind take the last one's costs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bytes_per_s(device: torch.device) -> float | None:
    """Measured device->host->device bandwidth (bytes/s one way); ``None`` when the device is the host."""
    if device.type == "cpu":
        return None
    payload = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    host = torch.empty(payload.shape, dtype=torch.uint8, pin_memory=True)
    host.copy_(payload)
    _sync(device)
    start = time.perf_counter()
    host.copy_(payload, non_blocking=True)
    payload.copy_(host, non_blocking=True)
    _sync(device)
    return 2 * payload.numel() / (time.perf_counter() - start)


def profile_layers(stack: LayerStack, spec: TrialSpec, device: torch.device, *,
                   indices: Sequence[int] | None = None) -> list[LayerCost]:
    """Run each layer (or those of ``indices``) forward + backward on ``device`` for one micro-batch; count what
    autograd saves.

    Activation bytes are the distinct non-weight storages saved for backward plus the layer's output and its
    gradient (on CUDA, at least the allocator's measured peak above the weights, less parameter
    gradients; a LoRA trial's frozen base weights are ``frozen_bytes``, at the base's precision, and a low-bit
    base adds its module with the most full-precision weights to the activations, as the unit dequantizes them
    one module at a time, :mod:`worker.engine.frozen_weights`); ``forward_s`` and ``time_s`` time
    the forward and forward + backward. A borrowed (tied)
    parameter and its gradient count as the borrower's ``lent_bytes``: the borrowing shard holds a copy.
    The layer's weights are a throwaway init; the caller's RNG is untouched. The head adds the logits' tensors
    that exist only within its backward (:func:`head_transient_bytes`).

    Layers alike (the same `_signature`: a model's decoder layers, as a rule) have the same bytes, and their times
    differ by noise only: the first ``MEASURED_ALIKE`` of a kind are measured and the others take the last one's
    costs (the first of a kind can pay the device's first-use costs, as the first matrix product on a GPU does).
    Planning a model of many layers then runs a few of them, not all.
    """
    batch, seq = spec.micro_batch_size, spec.data.seq_len
    width = stack.width
    stack.positions.ids = None  # every profiled row counts its positions from 0, whatever ran before
    slots = optimizer_slots(spec.optimizer.kind, spec.optimizer.momentum)
    base_dtype = spec.model.base_dtype
    costs = []
    measured: dict[tuple[object, ...], list[LayerCost]] = {}  # a layer's signature -> its kind's costs measured
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for index in range(len(stack)) if indices is None else indices:
            name = stack.names[index]
            alike = measured.setdefault(_signature(stack, index), [])
            if len(alike) == MEASURED_ALIKE:
                costs.append(dataclasses.replace(alike[-1], name=name))
                continue
            params = [t.to(device).requires_grad_() for t in init_layer(stack, index, spec.seed)]
            for ref, tensor in zip(stack.owned[index], params, strict=True):
                stack.bind(index, ref.name, tensor)
            borrowed = [torch.zeros(b.owner.shape, device=device, requires_grad=True) for b in stack.borrowed[index]]
            for borrow, tensor in zip(stack.borrowed[index], borrowed, strict=True):
                stack.bind(index, borrow.name, tensor)
            frozen = [torch.zeros(f.shape, device=device) for f in stack.frozen[index]]
            for ref, tensor in zip(stack.frozen[index], frozen, strict=True):
                stack.bind(index, ref.name, tensor, trainable=False)
            ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
            x = ids if index == 0 else torch.zeros(batch, seq, width, device=device, requires_grad=True)
            weights = {t.untyped_storage().data_ptr() for t in (*params, *borrowed, *frozen)}
            storages: dict[int, int] = {}

            def pack(t: torch.Tensor, storages: dict[int, int] = storages, weights: set[int] = weights) -> torch.Tensor:
                if t.untyped_storage().data_ptr() not in weights:  # weights are counted as state already
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            layer = stack.layers[index].train()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            start = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                    torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
                out = layer(x, ids, 1) if index == len(stack) - 1 else layer(x)
            _sync(device)
            forward_s = time.perf_counter() - start
            if out.requires_grad:  # a LoRA trial's first layers may have nothing to train
                out.backward(torch.ones_like(out))
            _sync(device)
            elapsed = time.perf_counter() - start
            owned = stack.layer_numel(index)
            lent = sum(b.owner.numel for b in stack.borrowed[index])
            head = stack.layers[index]
            # A chunked head hands its tied weight's gradient to the store as it makes it (units.py): the
            # borrower holds the weight only.
            streams = (isinstance(head, CausalLMHead) and head.token_chunk is not None and head.chunkable
                       and [b.name for b in stack.borrowed[index]] == ["lm_head.weight"])
            lent_copies = 1 if streams else 2
            activations = sum(storages.values()) + 2 * out.numel() * out.element_size()
            if isinstance(head, CausalLMHead):  # the logits' tensors that backward makes and no hook sees
                activations += head_transient_bytes(head, batch * seq, stack.config.vocab_size, bf16=spec.bf16)
            if base_dtype != "fp32":  # a low-bit base's weights, full precision one module at a time
                activations += dequantized_bytes(stack, index, torch.bfloat16 if spec.bf16 else torch.float32)
            if device.type == "cuda":  # the allocator saw the real peak, backward's transients included
                parameter_grads = (owned + lent) * FP32
                activations = max(activations, torch.cuda.max_memory_allocated(device) - before - parameter_grads)
            alike.append(LayerCost(
                name=name,
                param_bytes=owned * FP32,
                grad_bytes=owned * FP32,
                optim_bytes=owned * slots * FP32,
                lent_bytes=lent_copies * lent * FP32,
                frozen_bytes=sum(stored_bytes(ref.shape, base_dtype, vocabulary=ref.vocabulary)
                                 for ref in stack.frozen[index]),
                activation_bytes=activations,
                forward_s=forward_s,
                time_s=elapsed,
            ))
            costs.append(alike[-1])
            stack.release(index, index + 1)
    return costs


def _signature(stack: LayerStack, index: int) -> tuple[object, ...]:
    """What layer ``index``'s costs depend on besides the trial's batch: its modules with their settings (every
    plain attribute but a decoder layer's own index), its mask, and its parameters' names and shapes (owned,
    borrowed and frozen). A model's decoder layers share one unless the model sets them apart (a sliding window
    on some of them, another width)."""
    layer = stack.layers[index]
    settings = tuple(
        (path, type(module).__qualname__,
         tuple(sorted((key, value) for key, value in vars(module).items()
                      if key != "layer_idx" and isinstance(value, bool | int | float | str | None))))
        for path, module in layer.named_modules()
    )
    return (settings, getattr(layer, "mask", None),
            tuple((ref.name, ref.shape) for ref in stack.owned[index]),
            tuple((borrow.name, borrow.owner.shape) for borrow in stack.borrowed[index]),
            tuple((ref.name, ref.shape, ref.vocabulary) for ref in stack.frozen[index]))


def head_transient_bytes(head: CausalLMHead, tokens: int, vocab: int, *, bf16: bool) -> int:
    """Bytes of logits-sized tensors a head's forward + backward holds beyond what autograd saves: with whole
    logits, the gradients of their log-softmax and of the logits themselves (beside the saved log-softmax);
    in token chunks, a chunk's logits, log-softmax and gradient (nothing of them is saved)."""
    if head.token_chunk is not None and head.chunkable:
        return chunked_head_transient_bytes(tokens, vocab, head.token_chunk, low_precision=bf16)
    return 2 * tokens * vocab * FP32


def plan_layers(stack: LayerStack, spec: TrialSpec, device: torch.device, costs: Sequence[LayerCost],
                budget_bytes: int, *, cuts: Sequence[int] | None = None, head_token_chunk: int | None = None
                ) -> MemoryPlan:
    """The trial's memory plan from its layers' measured ``costs`` (the head's measured with
    ``head_token_chunk`` rows of logits at once, or whole when None or when the head has no chunked form).

    With ``cuts`` the shards start at those layers; else the partition solver packs them, and when the whole
    head cannot fit, the head is measured again in token chunks for :func:`solve_with_head_chunks`. With
    ``spec.activations`` "auto", each shard keeps its activations when that is cheaper than recomputing them.
    Raises ``BudgetError`` when a layer cannot fit even alone (the head in its smallest chunk).
    """
    head = stack.layers[-1]
    assert isinstance(head, CausalLMHead)
    if not head.chunkable:  # a LoRA-adapted lm_head: its logits are whole whatever was asked
        head_token_chunk = None

    def chunked_head(chunk: int) -> LayerCost:
        head.token_chunk = chunk
        try:
            return profile_layers(stack, spec, device, indices=[len(stack) - 1])[0]
        finally:
            head.token_chunk = None

    if cuts is not None:
        plan = plan_with_shards(costs, cuts, budget_bytes, head_token_chunk=head_token_chunk)
    elif head_token_chunk is not None:
        plan = dataclasses.replace(solve(costs, budget_bytes), head_token_chunk=head_token_chunk)
    else:
        plan = solve_with_head_chunks(costs, budget_bytes, tokens=spec.micro_batch_size * spec.data.seq_len,
                                      chunked_head=chunked_head if head.chunkable else None)
    if spec.activations == "auto":
        plan = choose_kept(plan, copy_bytes_per_s(device))
    return plan
