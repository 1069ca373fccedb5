"""The LM head's cross-entropy without its whole logits: token chunks forward, token and vocabulary chunks back.

A head computes ``logits = hidden @ weight.T`` (N tokens x V vocabulary) and the mean cross-entropy of each
token's target. With a 151,936-token vocabulary, 16k tokens make 9.9 GB of fp32 logits, and autograd keeps
them (or their log-softmax) for backward. Here no more than a chunk of them exists at once, and every number
is the one ``F.cross_entropy`` on the whole logits gives, bit for bit on CPU:

- **Forward**, a chunk of token rows at a time: the rows' logits (every vocabulary column, one matmul), their
  ``log_softmax`` (the same kernel, on whole rows) and each row's target log-probability. Kept for backward:
  the hidden states, each row's max logit and its log-sum-exp as the kernel computed it (``-log_softmax`` at
  the row's max, where the kernel's ``(x - max) - logsum`` is exactly ``-logsum``), N values each.
- The loss is then one ``nll_loss`` over the N picked log-probabilities, a (N, 1) input whose targets are all
  column 0: the reduction of the same values in the same order as ``cross_entropy``'s.
- **Backward**, the hidden states' gradient a chunk of token rows at a time: the rows' logits again, their
  log-softmax ``(x - max) - logsum`` (bit-identical to the forward kernel's), the log-softmax backward kernel on
  whole rows, and one matmul with the whole weight per chunk (a row's sum over the vocabulary in one call).
- **Backward**, the weight's gradient a chunk of vocabulary rows at a time: those columns' logits for every
  token, the log-softmax backward kernel on them (a column is appended so that the kernel's row sum is the
  row's gradient total, which it would be on the whole row: every other entry of a row is zero), and one
  matmul per chunk over every token (a weight row's sum over tokens in one call).

Each summation that PyTorch does in one kernel call is one call here too, over the same operands; what
changes is only which rows or columns a call covers. A matmul's element does not depend on how many other
rows or columns the call computes, for calls of two or more rows and columns (one row takes a
matrix-vector path that rounds differently), so chunks are balanced and never that small: see
:func:`spans`. The logits are computed three times instead of once (forward, and once in each backward
pass): chunking is for heads whose logits the memory budget cannot hold, and the plan turns it on only then.

Liger Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy avoid the logits the same way on
GPUs, with fused kernels and an online log-sum-exp over vocabulary blocks; both change the reduction order, so
their numbers are not plain PyTorch's. This loop keeps PyTorch's own kernels and is exact on CPU; on CUDA,
cuBLAS may pick another algorithm for a matmul of another shape, and the figures agree within float rounding
(see ``benchmarks/chunked_head.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

IGNORE = -100  # the label of a token that is not predicted (transformers' ignore index)
MIN_SPAN = 16  # the fewest rows or columns one matmul of a chunk covers (see the module docstring)


def spans(total: int, chunk: int) -> list[tuple[int, int]]:
    """``[0, total)`` cut into the fewest balanced spans of at most ``chunk`` (none under ``MIN_SPAN``
    unless ``total`` is)."""
    count = max(1, math.ceil(total / max(chunk, MIN_SPAN)))
    count = min(count, max(1, total // MIN_SPAN))
    base, extra = divmod(total, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def vocab_chunk(tokens: int, vocab: int, token_chunk: int) -> int:
    """Vocabulary rows per weight-gradient chunk: the columns whose logits for all ``tokens`` take the room of
    ``token_chunk`` rows of whole logits."""
    return max(MIN_SPAN, math.ceil(vocab * min(token_chunk, tokens) / max(tokens, 1)))


class GradSink:
    """Where a chunked loss's backward hands its weight's gradient, if anywhere: ``target`` is read when
    backward runs (a unit sets it between the forward and the backward), and called with each chunk of rows in
    row order; None: the gradient goes to ``weight.grad`` as usual."""

    def __init__(self) -> None:
        self.target: Callable[[torch.Tensor], None] | None = None


class _LinearLogSoftmaxPick(torch.autograd.Function):
    """(hidden (N, C), weight (V, C), targets (N,)) -> (N, 1): each row's log-probability of its target
    (0 for an ignored row), in chunks; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_chunk: int,
                dtype: torch.dtype, sink: GradSink | None) -> torch.Tensor:
        tokens = hidden.shape[0]
        w = weight.to(dtype)
        h = hidden.to(dtype)
        safe = targets.clamp(min=0).unsqueeze(1)
        picked = torch.empty(tokens, 1, dtype=torch.float32, device=hidden.device)
        row_max = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        logsum = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        for start, stop in spans(tokens, token_chunk):
            logits = F.linear(h[start:stop], w).float()
            logp = torch.log_softmax(logits, 1)
            top = logits.argmax(1, keepdim=True)
            row_max[start:stop] = logits.gather(1, top).squeeze(1)
            logsum[start:stop] = -logp.gather(1, top).squeeze(1)
            picked[start:stop] = logp.gather(1, safe[start:stop])
            del logits, logp
        picked.masked_fill_((targets == IGNORE).unsqueeze(1), 0.0)
        ctx.save_for_backward(hidden, weight, targets, row_max, logsum)
        ctx.token_chunk, ctx.dtype, ctx.sink = token_chunk, dtype, sink
        return picked

    @staticmethod
    def backward(ctx: Any, grad_picked: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, row_max, logsum = ctx.saved_tensors
        dtype = ctx.dtype
        tokens, vocab = hidden.shape[0], weight.shape[0]
        w, h = weight.to(dtype), hidden.to(dtype)
        # The gradient of each row's log-probabilities is zero but at its target, so the row's total (what the
        # log-softmax backward subtracts, scaled by the probabilities) is that one value, exactly.
        total = torch.where(targets == IGNORE, 0.0, grad_picked.squeeze(1).float())
        safe = targets.clamp(min=0)

        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_hidden = torch.empty(tokens, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
            for start, stop in spans(tokens, ctx.token_chunk):
                logp = _log_probs(F.linear(h[start:stop], w).float(), row_max[start:stop], logsum[start:stop])
                grad_logp = torch.zeros_like(logp).scatter_(1, safe[start:stop, None], total[start:stop, None])
                grad_logits = torch._log_softmax_backward_data(grad_logp, logp, 1, torch.float32)
                del logp, grad_logp
                grad_hidden[start:stop] = (grad_logits.to(dtype) @ w).to(hidden.dtype)
                del grad_logits

        grad_weight = None
        if ctx.needs_input_grad[1]:
            target = None if ctx.sink is None else ctx.sink.target
            grad_weight = torch.empty_like(weight) if target is None else None
            for start, stop in spans(vocab, vocab_chunk(tokens, vocab, ctx.token_chunk)):
                logp = _log_probs(F.linear(h, w[start:stop]).float(), row_max, logsum)
                inside = (safe >= start) & (safe < stop)
                grad_logp = torch.zeros(tokens, stop - start + 1, dtype=torch.float32, device=hidden.device)
                grad_logp[inside, (safe[inside] - start)] = total[inside]
                grad_logp[:, -1] = torch.where(inside, 0.0, total)  # the row's total, when outside these columns
                logp = torch.cat([logp, torch.zeros(tokens, 1, dtype=logp.dtype, device=logp.device)], 1)
                grad_logits = torch._log_softmax_backward_data(grad_logp, logp, 1, torch.float32)[:, :-1]
                del logp, grad_logp
                rows = (grad_logits.to(dtype).t() @ h).to(weight.dtype)
                del grad_logits
                if target is not None:
                    target(rows)
                else:
                    grad_weight[start:stop] = rows
                del rows
        return grad_hidden, grad_weight, None, None, None, None


def _log_probs(logits: torch.Tensor, row_max: torch.Tensor, logsum: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` of logits whose rows' max and log-sum-exp are known: the CPU kernel's own arithmetic."""
    return (logits - row_max.unsqueeze(1)) - logsum.unsqueeze(1)


def picked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_chunk: int, *,
                     weight_grad_sink: GradSink | None = None) -> torch.Tensor:
    """Each token's log-probability of its target under ``hidden @ weight.T``, as a (N, 1) tensor (0 where the
    target is ``IGNORE``), never holding more than ``token_chunk`` rows of logits. Under autocast the matmuls
    run in its dtype, as the head's ``nn.Linear`` would.

    With a ``weight_grad_sink`` whose target is set when backward runs, backward hands the weight's gradient to
    it a chunk of rows at a time, in row order, instead of accumulating it into ``weight.grad``: the gradient
    then never exists whole (the engine streams a tied weight's contribution into its store this way)."""
    dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
        else torch.float32
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearLogSoftmaxPick.apply(hidden.float(), weight, targets, token_chunk, dtype, weight_grad_sink)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, token_chunk: int,
                          reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=IGNORE, reduction=reduction)``
    for hidden (N, C), weight (V, C) and targets (N,), with the same numbers, without the (N, V) logits."""
    return picked_loss(picked_log_probs(hidden, weight, targets, token_chunk), targets, reduction=reduction)


def picked_loss(picked: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """The cross-entropy of the (N, 1) picked log-probabilities: ``nll_loss`` with every row's target in
    column 0, so the same values are reduced in the same order as over the whole logits."""
    column = torch.where(targets == IGNORE, IGNORE, 0)
    return F.nll_loss(picked, column, ignore_index=IGNORE, reduction=reduction)
