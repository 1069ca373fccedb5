"""On a CUDA device: fp32 exactness against plain PyTorch on the same device, bf16 tracking fp32, and the
device memory of every unit within the budget. Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from tests.engine.conftest import CPU, run_all, tiny_spec
from tests.engine.test_exactness import OPTIMIZERS, PLANS, plain_training
from worker.engine import ModelSpec, TrialSession, trial_create

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")


def test_it_trains_exactly_like_plain_pytorch_on_cuda(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS["adamw"])
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="init", device=CPU, cuts=[0])
    TrialSession.open(spill_dir=tmp_path, trial_id="init", device=CPU).export(tmp_path / "init")
    reference = plain_training(tmp_path / "init", spec, device=CUDA)

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CUDA, cuts=PLANS["3-shards"])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CUDA)
    losses = [r.loss for r in run_all(session) if r.loss is not None]
    session.export(tmp_path / "final")
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
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)
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
