"""Export writes a save_pretrained directory that transformers loads, with tied weights and the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import GPT2LMHeadModel

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import ModelSpec, TrialSession, trial_create
from worker.engine.data import TokenBlocks


@pytest.mark.parametrize("cuts", [[0], [0, 3]])
def test_it_exports_a_loadable_tied_model_with_the_engines_loss(
    cuts: list[int], tokens_path: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(tokens_path, steps=3, eval_every=3, eval_batches=1)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=cuts)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    engine_eval = [r.eval_loss for r in run_all(session) if r.eval_loss is not None]
    session.export(tmp_path / "out")

    model = GPT2LMHeadModel.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    for file in (tmp_path / "out").glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            assert "lm_head.weight" not in set(f.keys())  # stored once, as wte
    batch = TokenBlocks(spec.data, vocab_size=256).eval_batch(batch=0, batch_size=spec.micro_batch_size)
    with torch.no_grad():  # an evaluation's loss: its summed token losses over the tokens it predicts
        summed = model(batch, labels=batch, num_items_in_batch=1).loss.item()
    assert summed / batch[:, 1:].numel() == engine_eval[0]


def test_it_starts_a_trial_from_an_exported_directory(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, steps=2)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="a", device=CPU, cuts=[0, 2])
    TrialSession.open(spill_dir=tmp_path, trial_id="a", device=CPU).export(tmp_path / "a-init")

    pretrained = tiny_spec(tokens_path, steps=2, model=ModelSpec(pretrained_dir=str(tmp_path / "a-init")))
    trial_create(spec=pretrained, spill_dir=tmp_path, trial_id="b", device=CPU, cuts=[0])
    TrialSession.open(spill_dir=tmp_path, trial_id="b", device=CPU).export(tmp_path / "b-init")

    a = GPT2LMHeadModel.from_pretrained(tmp_path / "a-init", local_files_only=True).state_dict()
    b = GPT2LMHeadModel.from_pretrained(tmp_path / "b-init", local_files_only=True).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
