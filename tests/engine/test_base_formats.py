"""The precisions of a shared base: round trips within each format's error bound, and bitsandbytes' bytes and values.

bitsandbytes runs on CPU here (its CPU backend); its CUDA kernels are compared in test_cuda.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from worker.engine.base_formats import NF4_CODE, dequantize, dequantize_rows, dynamic_code, quantize
from worker.engine.sizes import NF4_BLOCK, stored_bytes, tensor_format

SHAPES = [(64, 128), (33, 70), (7, 5), (1000, 37)]  # whole blocks, a last short block, an odd count, many scales


def matrix(shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=generator) * 0.05
    weight[0] = 0.0  # an all-zero row (a padding token's embedding) and block
    weight[-1, -1] = 3.0  # an outlier
    return weight


def parts_bytes(parts: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in parts.values())


@pytest.mark.parametrize("shape", SHAPES)
def test_it_rounds_bf16_to_the_nearest_bfloat16(shape: tuple[int, int]) -> None:
    weight = matrix(shape)
    parts = quantize(weight, "bf16", "w")
    assert parts["w"].dtype == torch.bfloat16 and parts_bytes(parts) == stored_bytes(shape, "bf16")
    assert torch.equal(dequantize(parts, "w", shape, "bf16"), weight.to(torch.bfloat16).float())


@pytest.mark.parametrize("shape", SHAPES)
def test_it_keeps_int8_within_half_a_step_of_each_row_maximum(shape: tuple[int, int]) -> None:
    weight = matrix(shape)
    parts = quantize(weight, "int8", "w")
    assert parts_bytes(parts) == stored_bytes(shape, "int8") == weight.numel() + 4 * shape[0]
    restored = dequantize(parts, "w", shape, "int8")
    step = weight.abs().max(dim=1, keepdim=True).values / 127
    assert bool(((restored - weight).abs() <= step / 2 * 1.0001 + 1e-12).all())
    assert torch.equal(restored[0], torch.zeros(shape[1]))  # a zero row stays zero, not NaN
    assert restored[-1, -1] == pytest.approx(3.0, rel=1e-6)  # a row's maximum is exact


@pytest.mark.parametrize("shape", SHAPES)
def test_it_keeps_nf4_within_half_the_widest_code_gap_of_each_block_maximum(shape: tuple[int, int]) -> None:
    weight = matrix(shape)
    parts = quantize(weight, "nf4", "w")
    assert parts_bytes(parts) == stored_bytes(shape, "nf4")
    restored = dequantize(parts, "w", shape, "nf4").view(-1)
    flat = weight.view(-1)
    n, full = flat.numel(), flat.numel() // NF4_BLOCK * NF4_BLOCK
    blocks = [flat[i:i + NF4_BLOCK] for i in range(0, full, NF4_BLOCK)] + ([flat[full:]] if full < n else [])
    true_max = torch.stack([b.abs().max() for b in blocks])
    kept_max = torch.stack([restored[i * NF4_BLOCK:(i + 1) * NF4_BLOCK].abs().max() for i in range(len(blocks))])
    widest = max(b - a for a, b in itertools.pairwise(NF4_CODE)) / 2
    for i, block in enumerate(blocks):
        error = (restored[i * NF4_BLOCK:i * NF4_BLOCK + block.numel()] - block).abs().max()
        # the code rounds w / max to its nearest value; the double-quantized maximum adds its own error
        assert error <= widest * true_max[i] + (kept_max[i] - true_max[i]).abs() + 1e-7, i
    assert torch.equal(restored[:shape[1]], torch.zeros(shape[1]))  # zeros are a code value: exact
    # the double-quantized block maxima are within the 8-bit dynamic code's rounding (half its widest gap, under
    # 0.01) of the real ones less their mean
    spread = (true_max - true_max.mean()).abs().max()
    assert bool(((kept_max - true_max).abs() <= 0.01 * spread).all())


def test_vectors_stay_fp32_in_the_low_bit_formats() -> None:
    norm = torch.randn(37)
    for base_dtype in ("int8", "nf4"):
        parts = quantize(norm, base_dtype, "n")
        assert list(parts) == ["n"] and torch.equal(parts["n"], norm)
        assert stored_bytes((37,), base_dtype) == 37 * 4


@pytest.mark.parametrize("shape", SHAPES)
def test_it_stores_the_bytes_bitsandbytes_stores_and_dequantizes_to_its_values(shape: tuple[int, int]) -> None:
    bnb = pytest.importorskip("bitsandbytes.functional")
    weight = matrix(shape)
    assert torch.equal(dynamic_code(), bnb.create_dynamic_map())
    assert torch.equal(torch.tensor(NF4_CODE), bnb.get_4bit_type("nf4", device="cpu"))

    packed, state = bnb.quantize_4bit(weight, blocksize=NF4_BLOCK, quant_type="nf4", compress_statistics=True)
    parts = quantize(weight, "nf4", "w")
    assert torch.equal(parts["w"], packed.view(-1))
    assert torch.equal(parts["w.absmax2"], state.state2.absmax)
    assert torch.equal(parts["w.offset"], state.offset.view(1))
    # The block maxima's 8-bit codes: bitsandbytes' CPU library and its PyTorch reference (whose arithmetic
    # quantize follows) may round a value near a midpoint of the dynamic code apart (and a block of zeros to
    # either zero), so compare what the codes stand for: neighbours at most, under 2% of the block's scale.
    code, scale = dynamic_code(), state.state2.absmax.repeat_interleave(256)[:state.absmax.numel()]
    assert bool(((code[parts["w.absmax"].long()] - code[state.absmax.long()]).abs() * scale <= 0.02 * scale).all())
    # Dequantizing is the same arithmetic, bit for bit, on the same stored bytes.
    state.absmax = parts["w.absmax"]
    assert torch.equal(dequantize(parts, "w", shape, "nf4"), bnb.dequantize_4bit(packed, state))

    rows, row_max, _ = bnb.int8_vectorwise_quant(weight[1:].clone())  # bitsandbytes turns a zero row into NaNs
    parts = quantize(weight[1:], "int8", "w")
    assert torch.equal(parts["w"], rows) and torch.equal(parts["w.absmax"], row_max)
    assert torch.equal(dequantize(parts, "w", (shape[0] - 1, shape[1]), "int8"),
                       bnb.int8_vectorwise_dequant(rows, row_max))


def test_it_dequantizes_straight_to_the_compute_dtype_as_one_rounding() -> None:
    weight = matrix((64, 128))
    for base_dtype in ("int8", "nf4"):
        parts = quantize(weight, base_dtype, "w")
        assert torch.equal(dequantize(parts, "w", (64, 128), base_dtype, torch.bfloat16),
                           dequantize(parts, "w", (64, 128), base_dtype).to(torch.bfloat16))


def test_an_nf4_base_counts_its_vocabulary_matrices_as_int8_and_the_rest_as_nf4() -> None:
    embedding, block = (49152, 576), (576, 1536)
    assert tensor_format(embedding, "nf4", vocabulary=True) == "int8"
    assert stored_bytes(embedding, "nf4", vocabulary=True) == stored_bytes(embedding, "int8") == 49152 * (576 + 4)
    assert tensor_format(block, "nf4") == "nf4" and stored_bytes(block, "nf4") < stored_bytes(block, "int8") / 1.9
    for base_dtype in ("fp32", "bf16", "int8"):  # only nf4 treats them apart
        assert tensor_format(embedding, base_dtype, vocabulary=True) == base_dtype
    assert stored_bytes((576,), "nf4", vocabulary=True) == 576 * 4  # a vector stays fp32


def test_it_refuses_an_unknown_precision() -> None:
    with pytest.raises(ValueError, match="fp8"):
        quantize(torch.zeros(4, 4), "fp8", "w")


@pytest.mark.parametrize("tensor_dtype", ["fp32", "bf16", "int8"])
def test_an_embedding_lookup_reads_the_rows_a_whole_dequantization_gives(tensor_dtype: str) -> None:
    weight = torch.randn(300, 24)
    parts = quantize(weight, tensor_dtype, "w")
    whole = dequantize(parts, "w", (300, 24), tensor_dtype)
    ids = torch.tensor([[5, 299, 5], [0, 17, 120]])
    looked_up = torch.nn.functional.embedding(ids, dequantize_rows(parts, "w", (300, 24), tensor_dtype, ids))
    assert torch.equal(looked_up, torch.nn.functional.embedding(ids, whole))


def test_nf4_blocks_across_rows_dequantize_whole_for_a_lookup() -> None:
    weight = torch.randn(300, 24)  # 24 values a row: nf4's blocks of 64 span rows
    parts = quantize(weight, "nf4", "w")
    rows = dequantize_rows(parts, "w", (300, 24), "nf4", torch.tensor([3]))
    assert torch.equal(rows, dequantize(parts, "w", (300, 24), "nf4"))
