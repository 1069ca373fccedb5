"""LoRA trials on a bf16, int8 or nf4 base: plain PEFT's numbers on the dequantized weights, the base stored once
per host at its precision, and a full fine-tune refused."""

from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.engine.conftest import CPU, run_all
from tests.engine.test_lora import adapter_weights, lora_spec, save_base
from tests.plain_pytorch import assert_bit_identical, initial_weights, plain_training
from worker.engine import ModelSpec, TrialSession, shared_base, trial_create
from worker.engine import frozen_weights as frozen_weights_module
from worker.engine.base_formats import dequantize, quantize
from worker.engine.errors import SpecError
from worker.engine.layers import build_layer_stack
from worker.engine.sizes import stored_bytes


def dequantized_checkpoint(base: Path, base_dtype: str, out: Path) -> Path:
    """``base`` with every weight replaced by its value stored at ``base_dtype`` and read back (plain transformers
    and the format's own round trip; the format is checked against bitsandbytes in test_base_formats.py)."""
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            param.copy_(dequantize(quantize(param, base_dtype, name), name, shape, base_dtype))
    model.save_pretrained(out)
    return out


def with_base(spec, base: Path, base_dtype: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(spec, model=ModelSpec(pretrained_dir=str(base), base_dtype=base_dtype))


@pytest.mark.parametrize(("family", "base_dtype"), [("llama", "bf16"), ("llama", "int8"), ("llama", "nf4"),
                                                    ("gpt2", "nf4")])
def test_a_lora_trial_on_a_low_bit_base_trains_as_plain_peft_on_its_dequantized_weights(
        family: str, base_dtype: str, tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", family)
    spec = with_base(lora_spec(tokens_path, base, family), base, base_dtype)
    plain_base = dequantized_checkpoint(base, base_dtype, tmp_path / "dequantized")
    plain_spec = with_base(spec, plain_base, "fp32")  # the engine's initial adapters do not depend on the base
    reference = plain_training(initial_weights(plain_spec, tmp_path / "reference"), plain_spec)

    spill = tmp_path / "spill"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=[0, 2, 3])
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    results = run_all(session)
    session.export(tmp_path / "final")

    assert [r.loss for r in results if r.loss is not None] == reference.losses
    assert [r.eval_loss for r in results if r.eval_loss is not None] == reference.eval_losses
    assert_bit_identical(adapter_weights(tmp_path / "final"), reference.weights)
    # The merged export is the dequantized base plus the adapters: plain PEFT's merge on those weights.
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final").state_dict()
    plain = AutoModelForCausalLM.from_pretrained(plain_base).state_dict()
    untouched = [k for k in plain if "norm" in k or "ln_" in k]
    assert untouched and all(torch.equal(merged[k], plain[k]) for k in untouched)


def test_two_sweeps_of_one_checkpoint_in_two_precisions_keep_a_base_each_at_its_precision(
        tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", "llama")
    spill = tmp_path / "spill"
    plans = {}
    for trial_id, base_dtype, seed in (("bf16-a", "bf16", 1), ("nf4-a", "nf4", 2), ("nf4-b", "nf4", 3),
                                       ("fp32-a", "fp32", 4)):
        spec = with_base(lora_spec(tokens_path, base, "llama", seed=seed), base, base_dtype)
        plans[trial_id] = trial_create(spec=spec, spill_dir=spill, trial_id=trial_id, device=CPU)
    held = {tuple(b["trials"]): b for b in shared_base.bases(spill)}
    assert set(held) == {("bf16-a",), ("nf4-a", "nf4-b"), ("fp32-a",)}
    assert held[("fp32-a",)]["key"] == shared_base.content_key(base)  # an fp32 base keeps the content's key

    stack = build_layer_stack(ModelSpec(pretrained_dir=str(base)), lora_spec(tokens_path, base, "llama").lora)
    distinct = {ref.key: ref.shape for refs in stack.frozen for ref in refs}
    for trials, base_dtype in ((("bf16-a",), "bf16"), (("nf4-a", "nf4-b"), "nf4"), (("fp32-a",), "fp32")):
        assert held[trials]["bytes"] == sum(stored_bytes(shape, base_dtype) for shape in distinct.values())
        assert held[trials]["dtype"] == base_dtype
        # the plan counts the frozen weights a unit moves to the device at the base's precision
        assert plans[trials[0]].frozen_bytes == sum(stored_bytes(ref.shape, base_dtype)
                                                    for refs in stack.frozen for ref in refs)
    assert held[("fp32-a",)]["bytes"] > 1.95 * held[("bf16-a",)]["bytes"] > 1.95 * held[("nf4-a", "nf4-b")]["bytes"]

    assert not shared_base.release(spill_dir=spill, key=str(held[("nf4-a", "nf4-b")]["key"]), trial_id="nf4-a")
    shared_base.release_trial(spill_dir=spill, trial_id="bf16-a")  # the bf16 sweep ends: the nf4 one goes on
    assert {tuple(b["trials"]) for b in shared_base.bases(spill)} == {("nf4-b",), ("fp32-a",)}


def test_a_full_fine_tune_refuses_a_low_bit_base(tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", "llama")
    for base_dtype in ("bf16", "int8", "nf4"):
        with pytest.raises(SpecError, match=f"base_dtype {base_dtype} stores a frozen base.*fp32 master weights"):
            with_base(lora_spec(tokens_path, base, "llama", lora=None), base, base_dtype)
    with pytest.raises(SpecError, match="base_dtype 'fp8' is not one of fp32, bf16, int8, nf4"):
        ModelSpec(pretrained_dir=str(base), base_dtype="fp8")  # type: ignore[arg-type]


def test_a_full_precision_weight_lives_only_while_its_module_computes(tokens_path: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a backward unit's forward (a graph kept for its backward), every dequantized matrix is gone when
    its module returns: the graph holds the stored nf4 parts, and backward dequantizes them again."""
    base = save_base(tmp_path / "base", "llama")
    spec = with_base(lora_spec(tokens_path, base, "llama", steps=1, eval_every=0), base, "nf4")
    spill = tmp_path / "spill"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=[0, 2])
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    made: list[weakref.ref[torch.Tensor]] = []
    alive_after_forward: list[int] = []
    dequantized = 0
    real = frozen_weights_module.dequantize

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal dequantized
        dequantized += 1
        tensor = real(*args, **kwargs)
        if len(args[2]) == 2:  # a matrix, made anew (a vector stays fp32: the stored tensor itself)
            made.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(frozen_weights_module, "dequantize", recording)
    original = session._run_shard

    def run_shard(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(*args, **kwargs)
        alive_after_forward.append(sum(ref() is not None for ref in made))
        return out

    monkeypatch.setattr(session, "_run_shard", run_shard)
    phases = []
    while (unit := session.next_unit()) is not None:
        made.clear()
        session.run_unit()
        phases.append(unit.phase)
    assert phases[:3] == ["F", "FB", "B"]
    assert alive_after_forward == [0] * 6 and dequantized > 0  # F, FB, B of two micro-batches
