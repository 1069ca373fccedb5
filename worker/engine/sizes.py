"""Bytes of a trial's training state per parameter: the one definition the profiler, the session and the
web's memory preview share, so that a planned byte count and the buffers the engine writes agree.

Torch-free, so that the web process can import it without loading torch.
"""

from __future__ import annotations

FP32 = 4  # bytes per value of every spilled buffer: parameters, gradients, optimizer state, activations


def optimizer_slots(kind: str, momentum: float) -> int:
    """fp32 optimizer-state values kept per parameter: AdamW's two moments, SGD's momentum buffer (none
    without momentum). ``kind`` and ``momentum`` are those of :class:`worker.engine.config.OptimizerSpec`."""
    if kind == "adamw":
        return 2
    return 1 if momentum else 0


def chunked_head_transient_bytes(tokens: int, vocab: int, token_chunk: int, *, low_precision: bool = False) -> int:
    """Peak bytes of the chunk tensors a head whose loss runs in ``token_chunk``-row chunks
    (:mod:`worker.engine.chunked_loss`) holds at once: a chunk's fp32 logits, their log-softmax and its
    gradient, and under bf16 autocast a 16-bit copy of the logits. The weight-gradient pass's chunks of
    vocabulary columns for every token are sized to the same number of values."""
    return min(token_chunk, tokens) * vocab * (3 * FP32 + (2 if low_precision else 0))
