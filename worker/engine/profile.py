"""Measure each layer's bytes and time for a trial's micro-batch, one materialized layer at a time."""

from __future__ import annotations

import time

import torch

from worker.engine.config import TrialSpec
from worker.engine.layers import LayerStack
from worker.engine.partition import LayerCost
from worker.engine.sizes import FP32, optimizer_slots
from worker.engine.weights import init_layer


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


def profile_layers(stack: LayerStack, spec: TrialSpec, device: torch.device) -> list[LayerCost]:
    """Run each layer forward + backward on ``device`` for one micro-batch; count what autograd saves.

    Activation bytes are the distinct non-weight storages saved for backward plus the layer's output and its
    gradient (on CUDA, at least the allocator's measured peak above the weights, less parameter
    gradients; a LoRA trial's frozen base weights are ``frozen_bytes``); ``forward_s`` and ``time_s`` time
    the forward and forward + backward. A borrowed (tied)
    parameter and its gradient count as the borrower's ``lent_bytes``: the borrowing shard holds a copy.
    The layer's weights are a throwaway init; the caller's RNG is untouched.
    """
    batch, seq = spec.micro_batch_size, spec.data.seq_len
    width = stack.width
    stack.positions.ids = None  # every profiled row counts its positions from 0, whatever ran before
    slots = optimizer_slots(spec.optimizer.kind, spec.optimizer.momentum)
    costs = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for index, name in enumerate(stack.names):
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
                out = layer(x, ids) if index == len(stack) - 1 else layer(x)
            _sync(device)
            forward_s = time.perf_counter() - start
            if out.requires_grad:  # a LoRA trial's first layers may have nothing to train
                out.backward(torch.ones_like(out))
            _sync(device)
            elapsed = time.perf_counter() - start
            owned = stack.layer_numel(index)
            lent = sum(b.owner.numel for b in stack.borrowed[index])
            activations = sum(storages.values()) + 2 * out.numel() * out.element_size()
            if device.type == "cuda":  # the allocator saw the real peak, backward's transients included
                parameter_grads = (owned + lent) * FP32
                activations = max(activations, torch.cuda.max_memory_allocated(device) - before - parameter_grads)
            costs.append(LayerCost(
                name=name,
                param_bytes=owned * FP32,
                grad_bytes=owned * FP32,
                optim_bytes=owned * slots * FP32,
                lent_bytes=2 * lent * FP32,
                frozen_bytes=stack.frozen_numel(index) * FP32,
                activation_bytes=activations,
                forward_s=forward_s,
                time_s=elapsed,
            ))
            stack.release(index, index + 1)
    return costs
