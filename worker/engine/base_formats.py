"""The precisions a LoRA trial's frozen base is stored in, and the arithmetic that quantizes and dequantizes it.

``base_dtype`` (:data:`worker.engine.sizes.BASE_DTYPES`) is one of:

- ``fp32``: the checkpoint's weights as fp32, as a full fine-tune trains them;
- ``bf16``: every frozen tensor rounded to bfloat16;
- ``int8``: each matrix (every 2-D weight: linear layers, embeddings, an untied head) rounded to int8 with one
  fp32 absolute maximum per row (LLM.int8()'s row-wise absmax, bitsandbytes' ``int8_vectorwise_quant``:
  ``round(w * (127 / absmax))``, dequantized as ``q * absmax * (1 / 127)``);
- ``nf4``: each matrix in QLoRA's 4-bit NormalFloat (Dettmers et al. 2023), blocks of 64 values over the
  flattened tensor with one absolute maximum each, two 4-bit codes a byte (the first in the high nibble), and
  the block maxima double-quantized as bitsandbytes stores them (``quantize_4bit(compress_statistics=True)``):
  less their mean (``offset``), in the 8-bit dynamic code in blocks of 256, with one fp32 maximum each.

For ``int8`` and ``nf4`` vectors (norm weights, biases: a negligible share of the bytes) stay fp32, and an
``nf4`` base keeps the token embedding and the output head (tied: one matrix) in ``int8``
(:func:`worker.engine.sizes.tensor_format`), as QLoRA leaves them out of its 4-bit layers. So the functions here
take a tensor's own precision, ``tensor_dtype``, which a base records per tensor.

A stored tensor is a few named parts (:func:`quantize`): the data under the weight's own key and the
statistics under ``<key>.absmax`` (and ``<key>.absmax2``, ``<key>.offset`` for nf4), so that a layer's file
holds them side by side. :func:`dequantize` turns them back into the full-precision tensor on the device they
are on: on CUDA with bitsandbytes' own kernels; elsewhere in plain PyTorch, with the same arithmetic
(``tests/engine/test_base_formats.py`` checks the values against bitsandbytes' on CPU, ``test_cuda.py`` on a
GPU). Quantizing is plain PyTorch too, once per host when the base is built, with bitsandbytes' reference
arithmetic (the same bytes, checked by the same tests): bitsandbytes is imported only where its CUDA kernels
run, as its import on a CPU host loads kernels of its own and takes seconds.
"""

from __future__ import annotations

import functools
import math

import torch

from worker.engine.sizes import ABSMAX_BLOCK, BASE_DTYPES, NF4_BLOCK, is_quantized

# QLoRA's NormalFloat4 code (bitsandbytes' ``get_4bit_type("nf4")``): quantiles of a normal distribution,
# normalized to [-1, 1], with an exact zero.
NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


# 1 / 127 rounded to fp32, the factor bitsandbytes' int8 dequantization multiplies by.
INT8_SCALE = 7.874015718698502e-3


@functools.cache
def dynamic_code() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic code (``create_dynamic_map()``), which double quantization stores the
    block maxima in: for each decimal exponent -6..0, the means of evenly spaced fractions in [0.1, 1], and
    their negatives, then 0 and 1, sorted (256 values)."""
    values: list[float] = []
    for exponent in range(7):
        edges = torch.linspace(0.1, 1, 2 ** exponent + 1, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        values += ((10 ** (exponent - 6)) * means).tolist() + (-(10 ** (exponent - 6)) * means).tolist()
    values += [0.0, 1.0]
    return torch.tensor(sorted(values), dtype=torch.float32)


@functools.cache
def _nf4_pairs(device: torch.device) -> torch.Tensor:
    """(256,) int64: the NF4 values of a packed byte's high and low nibble, by the byte, as two fp32 in one
    8-byte word, so that one gather of a scalar per byte fetches both (a row gather of two floats costs several
    times more on a CPU)."""
    code, byte = torch.tensor(NF4_CODE), torch.arange(256)
    pairs = torch.stack([code[byte >> 4], code[byte & 0xF]], dim=-1).contiguous()
    return pairs.view(torch.int64).view(-1).to(device)


def _blockwise(flat: torch.Tensor, code: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into ``code`` (sorted) of the nearest value to each of ``flat`` (fp32) over its block's absolute
    maximum, and the maxima: bitsandbytes' blockwise quantization (a last, shorter block has its own)."""
    n = flat.numel()
    full = n - n % block
    absmax = flat[:full].view(-1, block).abs().max(dim=-1).values
    scaled = torch.clamp(flat[:full].view(-1, block) * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1)
    scaled = scaled.reshape(-1)
    if full < n:
        rest = flat[full:].abs().max()
        absmax = torch.cat([absmax, rest.view(1)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / rest.clamp(min=1e-38), -1, 1)])
    return torch.bucketize(scaled, (code[:-1] + code[1:]) / 2, out_int32=True).to(torch.uint8), absmax


def _scaled(values: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    """``values`` (fp32, flat, contiguous, a fresh buffer: multiplied in place) times their block's maximum, as
    bitsandbytes' kernels multiply them."""
    n = values.numel()
    full = n - n % block
    values[:full].view(-1, block).mul_(absmax[:full // block].view(-1, 1))
    if full < n:
        values[full:].mul_(absmax[-1])
    return values


def _int8_rows(rows: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """int8 ``rows`` (2-D) with their maxima ``absmax`` as fp32: ``q * absmax * (1 / 127)`` in that order, as
    bitsandbytes' ``int8_vectorwise_dequant`` rounds it (converted once, then multiplied in place: faster on a
    CPU than int8 times fp32)."""
    return rows.float().mul_(absmax.view(-1, 1)).mul_(INT8_SCALE)


def quantize(tensor: torch.Tensor, tensor_dtype: str, key: str) -> dict[str, torch.Tensor]:
    """``tensor`` (any float dtype) stored at ``tensor_dtype`` (its own precision in the base,
    :func:`worker.engine.sizes.tensor_format`): its parts by name (``key``, and for a quantized matrix its
    statistics under ``key.*``)."""
    if tensor_dtype not in BASE_DTYPES:
        raise ValueError(f"precision {tensor_dtype!r} is not one of {', '.join(BASE_DTYPES)}")
    tensor = tensor.detach().float().contiguous()
    if tensor_dtype == "bf16":
        return {key: tensor.to(torch.bfloat16)}
    if not is_quantized(tuple(tensor.shape), tensor_dtype):
        return {key: tensor}
    if tensor_dtype == "int8":
        rows = tensor.view(tensor.shape[0], -1)
        absmax = rows.abs().max(dim=1).values  # (rows,)
        # An all-zero row (a padding token's embedding) stays zero rather than 0 * inf.
        scale = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
        data = torch.round(rows * scale.unsqueeze(-1)).to(torch.int8).view(tensor.shape)
        return {key: data, f"{key}.absmax": absmax}
    codes, absmax = _blockwise(tensor.view(-1), torch.tensor(NF4_CODE), NF4_BLOCK)
    if codes.numel() % 2:  # an odd count: the last byte's low nibble is the code of 0, as bitsandbytes pads
        codes = torch.cat([codes, codes.new_full((1,), NF4_CODE.index(0.0))])
    packed = (codes[::2] << 4) | codes[1::2]  # (ceil(n / 2),)
    offset = absmax.mean()
    scales, absmax2 = _blockwise(absmax - offset, dynamic_code(), ABSMAX_BLOCK)
    return {key: packed, f"{key}.absmax": scales, f"{key}.absmax2": absmax2, f"{key}.offset": offset.view(1)}


def part_names(key: str, shape: tuple[int, ...], tensor_dtype: str) -> list[str]:
    """The names :func:`quantize` stores a tensor of ``shape`` under."""
    if not is_quantized(shape, tensor_dtype):
        return [key]
    if tensor_dtype == "int8":
        return [key, f"{key}.absmax"]
    return [key, f"{key}.absmax", f"{key}.absmax2", f"{key}.offset"]


def dequantize(parts: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], tensor_dtype: str,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tensor of ``shape`` stored as ``parts`` (:func:`quantize`'s, on any device), as ``dtype`` on that
    device. On CUDA a quantized matrix goes through bitsandbytes' kernels; elsewhere through plain PyTorch
    with their arithmetic (the values in fp32, rounded to ``dtype`` once)."""
    data = parts[key]
    if not is_quantized(shape, tensor_dtype):
        return data.to(dtype)
    if data.device.type == "cuda":
        return _dequantize_cuda(parts, key, shape, tensor_dtype, dtype)
    if tensor_dtype == "int8":
        return _int8_rows(data.view(shape[0], -1), parts[f"{key}.absmax"]).view(shape).to(dtype)
    absmax = _scaled(dynamic_code().to(data.device)[parts[f"{key}.absmax"].long()], parts[f"{key}.absmax2"],
                     ABSMAX_BLOCK)
    absmax += parts[f"{key}.offset"]
    # both codes of a byte at once, as one 8-byte word a byte
    values = _nf4_pairs(data.device).index_select(0, data.int()).view(torch.float32)[:math.prod(shape)]
    return _scaled(values, absmax, NF4_BLOCK).view(shape).to(dtype)


def dequantize_rows(parts: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], tensor_dtype: str,
                    rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor of ``shape`` as ``dtype`` whose rows ``rows`` (indices into the first dimension) hold what
    :func:`dequantize` gives them, the others left unset: what an embedding lookup of ``rows`` reads, without
    dequantizing a vocabulary of rows for a batch's few tokens (rows never written are never touched, so a CPU
    does not even map their memory). Where rows are not stored apart (nf4's blocks run across them) or on CUDA,
    the whole tensor, as :func:`dequantize` gives it."""
    data = parts[key]
    if data.device.type == "cuda" or (is_quantized(shape, tensor_dtype) and tensor_dtype != "int8"):
        return dequantize(parts, key, shape, tensor_dtype, dtype)
    rows = rows.reshape(-1).unique()
    out = torch.empty(shape, dtype=dtype, device=data.device)
    if is_quantized(shape, tensor_dtype):  # int8: each row with its own maximum, as dequantize computes it
        picked = _int8_rows(data.view(shape[0], -1)[rows], parts[f"{key}.absmax"][rows])
        out[rows] = picked.view(-1, *shape[1:]).to(dtype)
    else:
        out[rows] = data[rows].to(dtype)
    return out


def _dequantize_cuda(parts: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], tensor_dtype: str,
                     dtype: torch.dtype) -> torch.Tensor:
    """bitsandbytes' CUDA kernels on the stored parts (its own quantization state, rebuilt around them)."""
    import bitsandbytes.functional as bnb  # only where its CUDA kernels run (see the module docstring)

    data = parts[key]
    if tensor_dtype == "int8":
        rows = data.view(shape[0], -1)
        return bnb.int8_vectorwise_dequant(rows, parts[f"{key}.absmax"]).view(shape).to(dtype)
    device = data.device
    nested = bnb.QuantState(absmax=parts[f"{key}.absmax2"], code=dynamic_code().to(device),
                            blocksize=ABSMAX_BLOCK, dtype=torch.float32)
    state = bnb.QuantState(absmax=parts[f"{key}.absmax"], shape=torch.Size(shape), dtype=dtype,
                           blocksize=NF4_BLOCK, code=torch.tensor(NF4_CODE, device=device), quant_type="nf4",
                           offset=parts[f"{key}.offset"].view(()), state2=nested)
    return bnb.dequantize_4bit(data.view(-1, 1), state)
