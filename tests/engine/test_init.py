"""Streamed layer-by-layer init: GPT-2's distribution, seeded, independent of the plan, RNG untouched."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

from tests.engine.conftest import CPU, tiny_spec
from worker.engine import ModelSpec, TrialSession, trial_create
from worker.engine.layers import build_layer_stack
from worker.engine.weights import init_layer


def test_it_draws_the_gpt2_init_distribution() -> None:
    stack = build_layer_stack(ModelSpec(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=64))
    layers = [dict(zip([r.name for r in stack.owned[i]], init_layer(stack, i, seed=1), strict=True))
              for i in range(len(stack))]
    assert abs(layers[0]["wte.weight"].std().item() - 0.02) < 1e-3
    block = layers[1]
    assert abs(block["block.attn.c_attn.weight"].std().item() - 0.02) < 1e-3
    assert abs(block["block.mlp.c_fc.weight"].std().item() - 0.02) < 1e-3
    scaled = 0.02 / math.sqrt(2 * 4)  # GPT-2's residual-projection scaling
    assert abs(block["block.attn.c_proj.weight"].std().item() - scaled) < 5e-4
    assert abs(block["block.mlp.c_proj.weight"].std().item() - scaled) < 5e-4
    assert torch.equal(block["block.ln_1.weight"], torch.ones(128))
    assert torch.equal(block["block.attn.c_attn.bias"], torch.zeros(384))
    assert set(layers[-1]) == {"ln_f.weight", "ln_f.bias"}  # lm_head is wte, initialized once
    assert all(p.device.type == "meta" for p in stack.model.parameters())  # nothing stays materialized


def test_it_initializes_the_same_weights_for_any_plan(tokens_path: Path, tmp_path: Path) -> None:
    torch.manual_seed(123)
    caller_state = torch.get_rng_state()
    for trial_id, cuts in [("one", [0]), ("per-layer", [0, 1, 2, 3, 4, 5])]:
        trial_create(spec=tiny_spec(tokens_path), spill_dir=tmp_path, trial_id=trial_id, device=CPU, cuts=cuts)
        TrialSession.open(spill_dir=tmp_path, trial_id=trial_id, device=CPU).export(tmp_path / trial_id / "init")
    assert torch.equal(torch.get_rng_state(), caller_state)
    one = GPT2LMHeadModel.from_pretrained(tmp_path / "one" / "init").state_dict()
    per_layer = GPT2LMHeadModel.from_pretrained(tmp_path / "per-layer" / "init").state_dict()
    assert all(torch.equal(one[k], per_layer[k]) for k in one)
