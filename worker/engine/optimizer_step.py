"""One shard's optimizer update, streamed through the device in chunks, with torch.optim's own arithmetic.

AdamW and SGD are elementwise, so updating a shard chunk by chunk gives exactly the numbers of one
``optimizer.step()`` over the whole model: each chunk of parameters is stepped by a ``torch.optim``
optimizer given that chunk's gradients and state, after clipping with the coefficient
``torch.nn.utils.clip_grad_norm_`` computes from the step's global gradient norm. Only the shard's
parameters are resident whole; at most ``STEP_CHUNK`` elements of its gradients and of each optimizer
state buffer are on the device at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from worker.engine.config import TrialSpec
from worker.engine.schedule import step_lr
from worker.engine.sizes import FP32, optimizer_slots
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers

STEP_CHUNK = 1 << 20  # elements of gradient and optimizer state on the device at once during a step


def step_shard(*, store: SpillStore, transfers: Transfers, spec: TrialSpec, shard: int, params: torch.Tensor,
               step: int, total_norm: float, optim_steps: int, device: torch.device,
               grad: torch.Tensor | None = None, after_chunk: Callable[[], None] = lambda: None) -> None:
    """Update shard ``shard``'s flat parameters ``params`` (on the device, in place) for step ``step``
    from its gradients (``grad``, flat and on the device, when the caller has them in memory, consumed here;
    else the store's ``g{shard}``) and optimizer state ``m{shard}``/``v{shard}`` (``optim_steps`` updates
    taken before this one); stage the new parameters and optimizer state in ``store``. ``after_chunk`` is
    called after each chunk's update, before its state is written (a fault point)."""
    optim = spec.optimizer
    lr = step_lr(spec, step)
    clip = None
    if optim.clip_norm is not None:  # exactly torch.nn.utils.clip_grad_norm_'s arithmetic
        clip_coef = optim.clip_norm / (torch.tensor(total_norm, dtype=torch.float32) + 1e-6)
        clip = torch.clamp(clip_coef, max=1.0).to(device)
    slots = ["m", "v"][: optimizer_slots(optim.kind, optim.momentum)]
    has_state = optim.kind == "adamw" or optim_steps > 0  # SGD's momentum appears at step 1
    numel = params.numel()
    with contextlib.ExitStack() as stack:
        writers = {slot: stack.enter_context(store.writer(f"{slot}{shard}", nbytes=numel * FP32)) for slot in slots}
        for start in range(0, numel, STEP_CHUNK):
            stop = min(numel, start + STEP_CHUNK)
            chunk = params[start:stop]
            chunk.grad = read_chunk(store, transfers, f"g{shard}", start, stop) if grad is None else grad[start:stop]
            if clip is not None:
                chunk.grad.mul_(clip)
            state = {slot: read_chunk(store, transfers, f"{slot}{shard}", start, stop) for slot in slots if has_state}
            optimizer: torch.optim.Optimizer
            if optim.kind == "adamw":
                optimizer = torch.optim.AdamW([chunk], lr=lr, betas=optim.betas, eps=optim.eps,
                                              weight_decay=optim.weight_decay)
                optimizer.state[chunk] = {"step": torch.tensor(float(optim_steps)),
                                          "exp_avg": state["m"], "exp_avg_sq": state["v"]}
            else:
                optimizer = torch.optim.SGD([chunk], lr=lr, momentum=optim.momentum,
                                            weight_decay=optim.weight_decay)
                if state:
                    optimizer.state[chunk] = {"momentum_buffer": state["m"]}
            optimizer.step()
            after_chunk()
            chunk.grad = None
            if optim.kind == "adamw":
                writers["m"](state["m"])
                writers["v"](state["v"])
            elif slots:
                writers["m"](optimizer.state[chunk]["momentum_buffer"])
    store.write(f"p{shard}", params)


def read_chunk(store: SpillStore, transfers: Transfers, name: str, start: int, stop: int) -> torch.Tensor:
    """Elements ``[start, stop)`` of buffer ``name`` on the device."""
    tensor = transfers.load(store.path(name), stop - start, offset=start * FP32)
    store.bytes_read += tensor.nbytes
    return tensor
