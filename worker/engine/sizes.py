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


# The precisions a LoRA trial's frozen base may be stored in (worker.engine.base_formats); a full fine-tune's
# weights are fp32.
BASE_DTYPES = ("fp32", "bf16", "int8", "nf4")
NF4_BLOCK = 64  # values per 4-bit block, QLoRA's
ABSMAX_BLOCK = 256  # nf4 block maxima per block of their 8-bit double quantization


def tensor_format(shape: tuple[int, ...], base_dtype: str, *, vocabulary: bool = False) -> str:
    """The precision a frozen tensor of ``shape`` is stored at in a base at ``base_dtype``: the base's own, but
    for the matrices with a row per token (``vocabulary``: the token embedding and the output head) of an nf4
    base, which are int8. QLoRA quantizes only the blocks' linear layers to 4 bits and llama.cpp's 4-bit mixes
    keep the output matrix wider too: these two matrices carry most of 4-bit rounding's cost in a small model's
    loss for a small share of its bytes."""
    if base_dtype == "nf4" and vocabulary and len(shape) == 2:
        return "int8"
    return base_dtype


def is_quantized(shape: tuple[int, ...], tensor_dtype: str) -> bool:
    """Whether a frozen tensor of ``shape`` stored at ``tensor_dtype`` (:func:`tensor_format`) is in an 8-bit or
    4-bit code: matrices are; vectors (norm weights, biases) stay fp32."""
    return tensor_dtype in ("int8", "nf4") and len(shape) == 2


def stored_bytes(shape: tuple[int, ...], base_dtype: str, *, vocabulary: bool = False) -> int:
    """Bytes a frozen tensor of ``shape`` takes in a shared base stored at ``base_dtype`` (at its
    :func:`tensor_format`, ``vocabulary`` for the token embedding's and the output head's matrix): fp32 4 a
    value, bf16 2; an int8 matrix 1 a value and an fp32 maximum a row; an nf4 matrix half a byte a value, a
    byte a block of 64, an fp32 maximum a block of 256 blocks and the fp32 offset."""
    tensor_dtype = tensor_format(shape, base_dtype, vocabulary=vocabulary)
    numel = 1
    for size in shape:
        numel *= size
    if tensor_dtype == "bf16":
        return 2 * numel
    if not is_quantized(shape, tensor_dtype):
        return FP32 * numel
    if tensor_dtype == "int8":
        return numel + FP32 * shape[0]
    blocks = -(-numel // NF4_BLOCK)
    return -(-numel // 2) + blocks + FP32 * -(-blocks // ABSMAX_BLOCK) + FP32
