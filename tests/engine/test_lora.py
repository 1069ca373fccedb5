"""LoRA trials: sharded, spilled adapter training on a frozen base shared by the host equals plain PEFT training.

The reference is tests/plain_pytorch.py with ``peft``'s ``PeftModel`` on the same base and the engine's
initial adapters (``peft``'s own initialization). On one CPU thread the numbers match bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all
from tests.plain_pytorch import assert_bit_identical, initial_weights, plain_training
from worker.engine import (
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    ScheduleSpec,
    TrialSession,
    TrialSpec,
    shared_base,
    trial_create,
)
from worker.engine.config import LoraSpec
from worker.engine.errors import SpecError
from worker.engine.lora import ADAPTER_DIR


def save_base(directory: Path, family: str, *, attn_pdrop: float = 0.0) -> Path:
    """A tiny pretrained checkpoint of ``family`` (random weights, a fixed seed), as save_pretrained writes it.
    GPT-2's attention dropout is off unless asked for (see `test_gpt2_attention_dropout_...`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        if family == "llama":
            config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=SEQ,
                                 tie_word_embeddings=True, attention_dropout=0.1)
            LlamaForCausalLM(config).save_pretrained(directory)
        else:
            config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                attn_pdrop=attn_pdrop)
            GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


TARGETS = {"llama": ("q_proj", "v_proj", "down_proj"), "gpt2": ("c_attn", "c_fc")}


def lora_spec(tokens_path: Path, base: Path, family: str, **overrides: object) -> TrialSpec:
    spec = TrialSpec(
        model=ModelSpec(pretrained_dir=str(base)),
        data=DataSpec(tokens_path=str(tokens_path), seq_len=SEQ),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-2, weight_decay=0.1, clip_norm=0.5),
        schedule=ScheduleSpec(warmup_steps=2, decay="cosine"),
        batch_size=4, micro_batches=2, steps=6, eval_every=3, eval_batches=2, seed=11,
        lora=LoraSpec(r=4, alpha=8.0, dropout=0.1, target_modules=TARGETS[family]),
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def adapter_weights(export: Path) -> dict[str, torch.Tensor]:
    return load_file(export / ADAPTER_DIR / "adapter_model.safetensors")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("cuts", [[0], [0, 1, 2, 3]], ids=["1-shard", "per-layer"])
def test_lora_trains_exactly_like_plain_peft(family: str, cuts: list[int], tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", family)
    spec = lora_spec(tokens_path, base, family)
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)

    spill = tmp_path / "spill"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=cuts)
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    results = run_all(session)
    session.export(tmp_path / "final")

    assert [r.loss for r in results if r.loss is not None] == reference.losses
    assert [r.eval_loss for r in results if r.eval_loss is not None] == reference.eval_losses
    assert_bit_identical(adapter_weights(tmp_path / "final"), reference.weights)
    # The trial's own store holds the adapters only; the frozen base is the host's one shared copy.
    adapters = sum(t.numel() for t in reference.weights.values())
    assert sum(session.layout.numel) == adapters
    assert [b["trials"] for b in shared_base.bases(spill)] == [["t"]]


def test_gpt2_attention_dropout_under_lora_matches_peft_within_float_rounding(tokens_path: Path,
                                                                            tmp_path: Path) -> None:
    """GPT-2 with its attention dropout on: adapters within float32 rounding of PEFT's, not bit for bit.

    The same trial without attention dropout (above), Llama with attention dropout, and GPT-2 full training
    with it all match bit for bit. With transformers 5.24, GPT-2's attention dropout under LoRA leaves the
    first layer's adapter gradients differing in their last bits (about 1e-8 on values of 1e-2), so the
    adapters are compared within a tolerance a thousand times tighter than a one-step update.
    """
    base = save_base(tmp_path / "base", "gpt2", attn_pdrop=0.1)
    spec = lora_spec(tokens_path, base, "gpt2")
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    spill = tmp_path / "spill"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=[0, 1, 2, 3])
    results = run_all(TrialSession.open(spill_dir=spill, trial_id="t", device=CPU))
    TrialSession.open(spill_dir=spill, trial_id="t", device=CPU).export(tmp_path / "final")
    assert [r.loss for r in results if r.loss is not None] == pytest.approx(reference.losses, rel=1e-6)
    assert [r.eval_loss for r in results if r.eval_loss is not None] == pytest.approx(reference.eval_losses, rel=1e-6)
    weights = adapter_weights(tmp_path / "final")
    assert weights.keys() == reference.weights.keys()
    for name, tensor in reference.weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6)


def test_the_exports_load_with_peft_and_the_merge_equals_peft_merge_and_unload(
    tokens_path: Path, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base", "llama")
    spec = lora_spec(tokens_path, base, "llama", steps=2, eval_every=0)
    trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU, cuts=[0, 2])
    session = TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    run_all(session)
    session.export(tmp_path / "final")

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "final" / ADAPTER_DIR)
    expected = peft_model.merge_and_unload().state_dict()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final").state_dict()
    assert_bit_identical(merged, expected)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           AutoModelForCausalLM.from_pretrained(base).state_dict()["model.layers.0.self_attn.q_proj.weight"])


def test_trials_on_one_checkpoint_share_one_base_until_the_last_lets_go(tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", "llama")
    copy = tmp_path / "same-checkpoint-elsewhere"
    copy.mkdir()
    for path in base.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    spill = tmp_path / "spill"
    specs = {"a": lora_spec(tokens_path, base, "llama"), "b": lora_spec(tokens_path, copy, "llama", seed=12),
             "c": lora_spec(tokens_path, base, "llama", lora=LoraSpec(r=2, target_modules=("k_proj",)))}
    for trial_id, spec in specs.items():
        trial_create(spec=spec, spill_dir=spill, trial_id=trial_id, device=CPU)
    (held,) = shared_base.bases(spill)  # keyed by content: the copy of the checkpoint is the same base
    assert held["trials"] == ["a", "b", "c"]
    key = str(held["key"])
    assert held["bytes"] == sum(t.numel() * 4 for t in load_file(base / "model.safetensors").values())

    assert not shared_base.release(spill_dir=spill, key=key, trial_id="a")
    assert not shared_base.release(spill_dir=spill, key=key, trial_id="a")  # idempotent
    assert not shared_base.release(spill_dir=spill, key=key, trial_id="b")
    assert shared_base.bases(spill)[0]["trials"] == ["c"]
    assert shared_base.release(spill_dir=spill, key=key, trial_id="c")
    assert shared_base.bases(spill) == []


def test_units_of_two_trials_on_the_same_base_shard_read_it_once(tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", "llama")
    spill = tmp_path / "spill"
    for trial_id, seed in (("a", 1), ("b", 2)):
        trial_create(spec=lora_spec(tokens_path, base, "llama", seed=seed), spill_dir=spill, trial_id=trial_id,
                     device=CPU, cuts=[0, 2])
    sessions = [TrialSession.open(spill_dir=spill, trial_id=t, device=CPU) for t in ("a", "b")]
    shared_base.BaseCache.clear()
    reads = shared_base.BaseCache.reads
    sessions[0].run_unit()  # F of shard 0 (layers 0-1): two layers read
    sessions[1].run_unit()  # the same shard of the other trial: no read
    assert shared_base.BaseCache.reads - reads == 2
    sessions[0].run_unit()  # FB of shard 1 (layers 2-3): read, and shard 0's layers let go
    assert shared_base.BaseCache.reads - reads == 4
    assert shared_base.BaseCache.holding(CPU) == (str(shared_base.bases(spill)[0]["key"]), 2, 4)


def test_a_background_read_leaves_out_the_base_layers_the_running_unit_loads(tokens_path: Path,
                                                                             tmp_path: Path) -> None:
    """Prefetching another trial's next unit on the shard the device is about to run reads nothing: the
    device will hold those layers; the unit then finds them, and the results are the plain ones."""
    base = save_base(tmp_path / "base", "llama")
    spill = tmp_path / "spill"
    for trial_id, seed in (("a", 1), ("b", 2)):
        trial_create(spec=lora_spec(tokens_path, base, "llama", seed=seed), spill_dir=spill, trial_id=trial_id,
                     device=CPU, cuts=[0, 2])
    a, b = (TrialSession.open(spill_dir=spill, trial_id=t, device=CPU) for t in ("a", "b"))
    shared_base.BaseCache.clear()
    reads = shared_base.BaseCache.reads
    running = a.base_read(a.next_unit())
    assert running is not None and running[1:] == (0, 2)
    b.prefetch(b.next_unit(), running=running)  # b's next unit reads the same layers: no read
    assert shared_base.BaseCache.reads == reads
    a.run_unit()
    b.run_unit()
    assert shared_base.BaseCache.reads - reads == 2
    # a's next unit is the last shard's: read in the background (as while a unit that reads no base runs),
    # taken by that unit, and held for b's unit on the same shard.
    a.prefetch(a.next_unit(), running=None)
    assert shared_base.BaseCache.reads - reads == 4
    hits = shared_base.BaseCache.hits
    a.run_unit()
    assert (shared_base.BaseCache.reads - reads, shared_base.BaseCache.hits) == (4, hits)
    b.run_unit()
    assert (shared_base.BaseCache.reads - reads, shared_base.BaseCache.hits) == (4, hits + 2)
    assert a.base_read(None) is None


def test_lora_needs_a_pretrained_model_and_known_target_modules(tokens_path: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="pretrained_dir"):
        TrialSpec(data=DataSpec(tokens_path=str(tokens_path)), lora=LoraSpec())
    with pytest.raises(SpecError, match="rank"):
        LoraSpec(r=0)
    base = save_base(tmp_path / "base", "llama")
    spec = lora_spec(tokens_path, base, "llama", lora=LoraSpec(target_modules=("no_such_proj",)))
    with pytest.raises(SpecError, match="no_such_proj"):
        trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    assert TrialSpec.from_dict(spec.to_dict()) == spec
