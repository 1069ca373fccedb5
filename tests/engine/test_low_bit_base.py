"""LoRA trials on a bf16, int8 or nf4 base: plain PEFT's numbers on the dequantized weights, the base stored once
per host at its precision, and a full fine-tune refused."""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all
from tests.engine.test_lora import adapter_weights, lora_spec, save_base
from tests.plain_pytorch import assert_bit_identical, initial_weights, plain_training
from worker.engine import ModelSpec, TrialSession, shared_base, trial_create
from worker.engine import frozen_weights as frozen_weights_module
from worker.engine.base_formats import dequantize, quantize
from worker.engine.errors import SpecError
from worker.engine.families import architecture_from_config, read_config
from worker.engine.layers import build_layer_stack
from worker.engine.sizes import stored_bytes, tensor_format


def dequantized_checkpoint(base: Path, base_dtype: str, out: Path) -> Path:
    """``base`` with every weight replaced by its value stored at ``base_dtype`` and read back (plain transformers
    and the format's own round trip; the format is checked against bitsandbytes in test_base_formats.py). The
    model's input embeddings and output head are its vocabulary matrices, as transformers names them."""
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    vocabulary = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            stored_as = tensor_format(shape, base_dtype, vocabulary=id(param) in vocabulary)
            param.copy_(dequantize(quantize(param, stored_as, name), name, shape, stored_as))
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
    distinct = {ref.key: ref for refs in stack.frozen for ref in refs}
    for trials, base_dtype in ((("bf16-a",), "bf16"), (("nf4-a", "nf4-b"), "nf4"), (("fp32-a",), "fp32")):
        assert held[trials]["bytes"] == sum(stored_bytes(ref.shape, base_dtype, vocabulary=ref.vocabulary)
                                            for ref in distinct.values())
        assert held[trials]["dtype"] == base_dtype
        # the plan counts the frozen weights a unit moves to the device at the base's precision
        assert plans[trials[0]].frozen_bytes == sum(stored_bytes(ref.shape, base_dtype, vocabulary=ref.vocabulary)
                                                    for refs in stack.frozen for ref in refs)
    assert held[("fp32-a",)]["bytes"] > 1.95 * held[("bf16-a",)]["bytes"] > 1.95 * held[("nf4-a", "nf4-b")]["bytes"]

    assert not shared_base.release(spill_dir=spill, key=str(held[("nf4-a", "nf4-b")]["key"]), trial_id="nf4-a")
    shared_base.release_trial(spill_dir=spill, trial_id="bf16-a")  # the bf16 sweep ends: the nf4 one goes on
    assert {tuple(b["trials"]) for b in shared_base.bases(spill)} == {("nf4-b",), ("fp32-a",)}


@pytest.mark.parametrize("tied", [True, False])
def test_an_nf4_base_keeps_the_token_embedding_and_the_head_in_int8(tied: bool, tokens_path: Path,
                                                                   tmp_path: Path) -> None:
    """The matrices with a row per token are int8 (a tied one stored once), the blocks' matrices nf4, the vectors
    fp32; the base's bytes are those the architecture counts from its config, and what the files hold."""
    base = tmp_path / "base"
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=SEQ, tie_word_embeddings=tied)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        LlamaForCausalLM(config).save_pretrained(base)
    lora = lora_spec(tokens_path, base, "llama").lora
    stack = build_layer_stack(ModelSpec(pretrained_dir=str(base)), lora)
    spill = tmp_path / "spill"
    key = shared_base.acquire(spill_dir=spill, stack=stack, pretrained_dir=base, trial_id="t", base_dtype="nf4")
    root = shared_base.base_root(spill, key)
    index = json.loads((root / shared_base.INDEX).read_text())
    parts: dict[str, torch.Tensor] = {}
    for filename in set(index["files"].values()):
        parts |= load_file(root / filename)

    vocabulary = {"model.embed_tokens.weight"} | (set() if tied else {"lm_head.weight"})
    assert {k for k in index["files"] if k.endswith("embed_tokens.weight") or k.startswith("lm_head")} == vocabulary
    for name in vocabulary:
        assert index["formats"][name] == "int8"
        assert parts[name].dtype == torch.int8 and parts[name].shape == (VOCAB, 32)
        assert parts[f"{name}.absmax"].shape == (VOCAB,) and f"{name}.absmax2" not in parts
    blocks = [k for k, shape in index["shapes"].items() if k.startswith("model.layers.") and len(shape) == 2]
    assert len(blocks) == 2 * 7
    for name in blocks:
        assert index["formats"][name] == "nf4"
        assert parts[name].dtype == torch.uint8 and parts[name].numel() == math.prod(index["shapes"][name]) // 2
        assert {f"{name}.absmax", f"{name}.absmax2", f"{name}.offset"} <= set(parts)
    norms = [k for k, shape in index["shapes"].items() if len(shape) == 1]
    assert norms and all(parts[k].dtype == torch.float32 for k in norms)

    stored = sum(t.numel() * t.element_size() for t in parts.values())
    assert index["bytes"] == stored == architecture_from_config(read_config(base)).base_bytes("nf4")


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
