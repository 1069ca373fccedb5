"""On a CUDA device: fp32 exactness against plain PyTorch on the same device, bf16 tracking fp32, the
device memory of every unit within the budget, and the transfer layer's copy stream and staging buffers.
Skipped without a GPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from tests.engine.conftest import run_all, tiny_spec
from tests.engine.test_chunked_head import whole_and_chunked
from tests.engine.test_exactness import OPTIMIZERS, PLANS
from tests.engine.test_transfer import write_floats
from tests.plain_pytorch import initial_weights, plain_training
from worker.engine import ModelSpec, TrialSession, trial_create
from worker.engine.transfer import Transfers

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")
SLEEP_CYCLES = 2_000_000_000  # about a second of GPU clock: torch.cuda._sleep keeps a stream busy that long


def test_it_trains_exactly_like_plain_pytorch_on_cuda(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS["adamw"])
    reference = plain_training(initial_weights(spec, tmp_path), spec, device=CUDA)

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CUDA, cuts=PLANS["3-shards"])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CUDA)
    losses = [r.loss for r in run_all(session) if r.loss is not None]
    session.export(tmp_path / "final")
    # A tolerance, unlike on CPU: CUDA libraries pick a kernel, and so an order of addition, per tensor
    # shape, alignment and free workspace (the engine's tensors are views of flat shard buffers, plain
    # PyTorch's are not), and some kernels add with atomics in no fixed order. Rounding differs in the last
    # bits, and training compounds it.
    assert losses == pytest.approx(reference.losses, rel=1e-5)
    final = dict(GPT2LMHeadModel.from_pretrained(tmp_path / "final", local_files_only=True).named_parameters())
    for name, weight in reference.weights.items():
        torch.testing.assert_close(final[name], weight.cpu(), rtol=0, atol=1e-5, msg=name)


def test_bf16_tracks_fp32(tokens_path: Path, tmp_path: Path) -> None:
    losses = {}
    for bf16 in (False, True):
        spec = tiny_spec(tokens_path, bf16=bf16, eval_every=0)
        trial_create(spec=spec, spill_dir=tmp_path, trial_id=str(bf16), device=CUDA, cuts=PLANS["3-shards"])
        session = TrialSession.open(spill_dir=tmp_path, trial_id=str(bf16), device=CUDA)
        losses[bf16] = [r.loss for r in run_all(session) if r.loss is not None]
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)  # bf16 keeps 8 bits of mantissa: close, not equal
    assert losses[True][-1] < losses[True][0]


def test_every_unit_stays_within_the_device_budget(tokens_path: Path, tmp_path: Path) -> None:
    torch.ones(64, 64, device=CUDA).matmul(torch.ones(64, 64, device=CUDA))  # cuBLAS workspace, context
    baseline = torch.cuda.memory_allocated(CUDA)
    model = ModelSpec(n_layer=8, n_embd=256, n_head=4, vocab_size=256, n_positions=32, dropout=0.1)
    spec = tiny_spec(tokens_path, model=model, budget_bytes=40 << 20, eval_every=0)
    plan = trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CUDA)
    assert len(plan.shards) > 1 and plan.state_bytes > spec.budget_bytes
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CUDA)
    peaks = [r.peak_device_bytes for r in run_all(session)]
    assert all(peak is not None and peak - baseline <= spec.budget_bytes for peak in peaks), max(peaks)


def test_a_prefetch_is_copied_on_the_copy_stream_and_awaited_on_the_device(tmp_path: Path) -> None:
    values = torch.randn(1000)
    transfers = Transfers(CUDA, max_numel=1000)
    copy, compute = transfers.copy_stream, torch.cuda.current_stream()
    assert copy is not None and copy != compute
    with torch.cuda.stream(copy):
        torch.empty(1000, device=CUDA)  # cache a block for the prefetch, so no cudaMalloc runs during the sleep
        torch.cuda._sleep(SLEEP_CYCLES)  # the prefetch's copy queues behind this
    transfers.start(("p0", 1), write_floats(tmp_path / "p0@1.bin", values), 1000)
    taken = transfers.take(("p0", 1))
    time.sleep(0.1)  # a copy on the compute stream would be over by now
    assert taken is not None
    assert not copy.query(), "take waited on the host for the copy"
    assert not compute.query(), "the compute stream does not wait for the copy"
    torch.testing.assert_close(taken.cpu(), values, rtol=0, atol=0)
    transfers.close()


def test_reads_in_a_row_reuse_the_staging_buffers_safely(tmp_path: Path) -> None:
    transfers = Transfers(CUDA, max_numel=1000)  # 2500 values go through the two staging buffers in 3 chunks
    files = {f"p{i}": (tmp_path / f"p{i}@1.bin", torch.randn(2500)) for i in range(5)}
    assert transfers.copy_stream is not None
    with torch.cuda.stream(transfers.copy_stream):
        torch.cuda._sleep(SLEEP_CYCLES // 10)  # copies wait: a buffer refilled before its copy ran corrupts them
    for name, (path, values) in files.items():
        transfers.start((name, 1), write_floats(path, values), 2500)
    torch.cuda._sleep(SLEEP_CYCLES // 10)  # the same for load, whose copies go on the compute stream
    path, values = files["p0"]
    torch.testing.assert_close(transfers.load(path, 2400, offset=4 * 100).cpu(), values[100:], rtol=0, atol=0)
    for name, (_, values) in files.items():
        taken = transfers.take((name, 1))
        assert taken is not None and taken.device.type == "cuda"
        torch.testing.assert_close(taken.cpu(), values, rtol=0, atol=0)
    transfers.close()


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_chunked_head_matches_whole_logits_on_cuda(bf16: bool) -> None:
    whole, chunked = whole_and_chunked(512, 256, 32000, 64, bf16=bf16, device=CUDA)
    # cuBLAS may pick another kernel for a matmul of another shape: agreement within rounding, not bit for bit.
    tolerance = 1e-2 if bf16 else 1e-5
    for a, b in zip(whole, chunked, strict=True):
        assert a.device.type == "cuda"
        torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("shape", [(64, 128), (33, 70), (4096, 14)])
def test_bitsandbytes_cuda_kernels_dequantize_to_the_cpu_path_values(shape: tuple[int, int]) -> None:
    """The base's stored parts moved to the GPU dequantize there through bitsandbytes' kernels to the values the
    CPU path gives (the same arithmetic: a product per value), in fp32 and straight to bf16."""
    from worker.engine.base_formats import dequantize, quantize

    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.05
    for base_dtype in ("int8", "nf4"):
        parts = quantize(weight, base_dtype, "w")
        on_gpu = {name: part.to(CUDA) for name, part in parts.items()}
        for dtype in (torch.float32, torch.bfloat16):
            expected = dequantize(parts, "w", shape, base_dtype, dtype)
            # fp32: the same products; bf16: rounded once from them (a kernel that rounded otherwise is one ulp)
            torch.testing.assert_close(dequantize(on_gpu, "w", shape, base_dtype, dtype).cpu(), expected,
                                       rtol=0 if dtype == torch.float32 else 2 ** -8, atol=0)


@pytest.mark.parametrize("base_dtype", ["bf16", "nf4"])
def test_a_lora_trial_on_a_low_bit_base_tracks_plain_peft_on_cuda(base_dtype: str, tokens_path: Path,
                                                                  tmp_path: Path) -> None:
    """On the GPU, within CUDA's rounding: a LoRA trial on a bf16 or nf4 base against plain PEFT on the same
    dequantized weights (bit for bit on CPU: tests/engine/test_low_bit_base.py)."""
    from tests.engine.test_lora import lora_spec, save_base
    from tests.engine.test_low_bit_base import dequantized_checkpoint, with_base

    base = save_base(tmp_path / "base", "llama")
    spec = with_base(lora_spec(tokens_path, base, "llama"), base, base_dtype)
    plain_spec = with_base(spec, dequantized_checkpoint(base, base_dtype, tmp_path / "dequantized"), "fp32")
    reference = plain_training(initial_weights(plain_spec, tmp_path / "reference"), plain_spec, device=CUDA)
    trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CUDA, cuts=[0, 2, 3])
    losses = [r.loss for r in run_all(TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CUDA))
              if r.loss is not None]
    assert losses == pytest.approx(reference.losses, rel=1e-5, abs=1e-5)


def test_a_one_shard_step_run_out_of_order_parks_and_sums_on_cuda(tokens_path: Path, tmp_path: Path) -> None:
    """A model of one shard: micro-batches 3 and 2 run before 0 and 1 and park their gradients on the way through
    the device; the step's S unit adds them to the sum. The losses are those of the micro-batches run in order."""
    spec = tiny_spec(tokens_path, micro_batches=4, steps=3, eval_every=0)
    trial_create(spec=spec, spill_dir=tmp_path / "in-order", trial_id="t", device=CUDA, cuts=[0])
    in_order = TrialSession.open(spill_dir=tmp_path / "in-order", trial_id="t", device=CUDA)
    expected = [r.loss for r in run_all(in_order) if r.loss is not None]
    trial_create(spec=spec, spill_dir=tmp_path / "parked", trial_id="t", device=CUDA, cuts=[0])
    session = TrialSession.open(spill_dir=tmp_path / "parked", trial_id="t", device=CUDA)
    losses, token = [], 1
    for _ in range(spec.steps):
        for lane in (3, 2, 0, 1, 0):  # the last: the step's S unit, its segment's one lane
            result = session.run_unit(token=token, lane=lane)
            token += 1
            if result.loss is not None:
                losses.append(result.loss)
    assert losses == pytest.approx(expected, rel=1e-5)
