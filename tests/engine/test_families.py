"""Every family the engine trains: its parameter counts, adapter, exact sharded training and export.

Tiny random configs built locally (no hub), so each case takes seconds.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.masking_utils import create_sliding_window_causal_mask

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all, tiny_spec
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_training
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, TrialSession, TrialSpec, trial_create
from worker.engine.data import TokenBlocks, tokenize_corpus
from worker.engine.errors import SpecError
from worker.engine.families import (
    CAUSAL_LM_CLASSES,
    FAMILIES,
    UnknownArchitecture,
    architecture_from_config,
    architecture_from_spec,
)
from worker.engine.layers import LayerStack, build_layer_stack
from worker.engine.train import main
from worker.engine.weights import init_layer

# One tiny config per family; grouped-query attention where the family has it (2 kv heads for 4 heads).
TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 96, "n_positions": 32},
    **{family: {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 48, "vocab_size": 96, "max_position_embeddings": 32}
       for family in ("llama", "mistral", "qwen2", "qwen3")},
}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen3-head-dim": ("qwen3", {"head_dim": 16}),  # heads x head_dim != hidden
    "qwen3-default-head-dim": ("qwen3", {"attention_bias": True}),  # no head_dim: transformers' 128
    "mistral-mha": ("mistral", {"num_key_value_heads": 4}),
}


def real_model(model_type: str, **fields: Any) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def counts_match(model: torch.nn.Module) -> None:
    arch = architecture_from_config(model.config.to_dict())
    assert arch.architecture == type(model).__name__
    assert arch.n_params == sum(p.numel() for p in model.parameters())
    layers = arch.layer_params()
    assert [name for name, _, _ in layers] == ["embedding", *(f"block.{i}" for i in range(arch.n_layer)), "head"]
    blocks = model.transformer.h if arch.family == "gpt2" else model.model.layers
    for (_, owned, _), block in zip(layers[1:-1], blocks, strict=True):
        assert owned == sum(p.numel() for p in block.parameters())
    lm_head = model.get_output_embeddings().weight.numel()
    assert layers[-1][2] == (lm_head if arch.tied else 0)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_its_parameter_counts_are_the_real_models(family: str, tied: bool) -> None:
    counts_match(real_model(family, **TINY[family], tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_its_layers_are_the_engines(family: str, tied: bool) -> None:
    spec = ModelSpec(family=family, n_layer=3, n_embd=48, n_head=6, n_kv_head=None if family == "gpt2" else 3,
                     vocab_size=100, n_positions=40, tie_word_embeddings=tied)
    stack = build_layer_stack(spec)
    engine = [(name, stack.layer_numel(i), sum(b.owner.numel for b in stack.borrowed[i]))
              for i, name in enumerate(stack.names)]
    assert architecture_from_spec(spec).layer_params() == engine


@pytest.mark.parametrize("variant", VARIANTS)
def test_its_parameter_counts_follow_each_familys_options(variant: str) -> None:
    family, extra = VARIANTS[variant]
    counts_match(real_model(family, **{**TINY[family], **extra}))


def test_it_names_an_architecture_it_does_not_know() -> None:
    with pytest.raises(UnknownArchitecture, match="architecture 'FooForCausalLM' \\(model_type 'foo'\\) is not "
                       "supported; supported: gpt2, llama, mistral, qwen2, qwen3"):
        architecture_from_config({"model_type": "foo", "architectures": ["FooForCausalLM"], "hidden_size": 8})
    assert issubclass(UnknownArchitecture, SpecError)
    arch = architecture_from_config({**TINY["llama"], "architectures": ["LlamaForCausalLM"]})  # no model_type
    assert arch.family == "llama"
    with pytest.raises(SpecError, match="hidden_size"):
        architecture_from_config({"model_type": "qwen2", "num_hidden_layers": 2})


# -- the adapter: layer by layer is the whole model ----------------------------------------------------------

LAYER_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"{family}-{'tied' if tied else 'untied'}": (family, {"tie_word_embeddings": tied})
       for family in FAMILIES for tied in (True, False)},
    "mistral-sliding-window": ("mistral", {"sliding_window": 8}),  # shorter than the sequence: it masks
    "qwen2-sliding-layers": ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    "qwen3-sliding-layers": ("qwen3", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    **{name: variant for name, variant in VARIANTS.items() if name != "qwen3-default-head-dim"},
}


def dropout_fields(family: str) -> dict[str, float]:
    if family == "gpt2":
        return {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    return {"attention_dropout": 0.1}


@pytest.mark.parametrize("case", LAYER_CASES)
def test_layer_by_layer_is_the_whole_model_bit_for_bit(case: str) -> None:
    family, extra = LAYER_CASES[case]
    config = AutoConfig.for_model(family, **{**TINY[family], **dropout_fields(family), **extra}, use_cache=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    stack = LayerStack(model)
    ids = torch.randint(0, 96, (2, 24))

    torch.manual_seed(1)  # the loss of a batch the engine divides by its predicted tokens, as transformers may
    whole = model(ids, labels=ids, num_items_in_batch=ids[:, 1:].numel()).loss
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    torch.manual_seed(1)
    hidden = ids
    for index, layer in enumerate(stack.layers):
        hidden = layer(hidden, ids, ids[:, 1:].numel()) if index == len(stack) - 1 else layer(hidden)
    hidden.backward()
    assert hidden.item() == whole.item()
    assert all(torch.equal(p.grad, expected[name]) for name, p in model.named_parameters())
    assert len(stack) == config.num_hidden_layers + 2
    assert [len(b) for b in stack.borrowed] == [0] * (len(stack) - 1) + [int(config.tie_word_embeddings)]
    masks = [getattr(layer, "mask", None) for layer in stack.layers[1:-1]]
    # Mistral's config has a window by default (4096); Qwen's only when asked for, and then on some layers.
    assert (create_sliding_window_causal_mask in masks) == ("sliding" in case or family == "mistral")


# -- sharded, spilled training is plain PyTorch's, for every family ------------------------------------------

OPTIMIZERS = {
    "adamw": OptimizerSpec(kind="adamw", lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, clip_norm=0.5),
    "sgd": OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01, clip_norm=0.5),
}


def family_spec(tokens_path: Path, family: str, *, tied: bool = True, **overrides: Any) -> TrialSpec:
    """A 3-block model of ``family`` (grouped-query: 2 kv heads for 4 heads, except GPT-2) on the tiny trial."""
    model = ModelSpec(family=family, n_layer=3, n_embd=32, n_head=4, n_kv_head=None if family == "gpt2" else 2,
                      n_inner=None if family == "gpt2" else 48, vocab_size=VOCAB, n_positions=SEQ, dropout=0.1,
                      tie_word_embeddings=tied)
    return tiny_spec(tokens_path, **{"model": model, "steps": 6, "eval_every": 3, "eval_batches": 1, **overrides})


@pytest.mark.parametrize(("kind", "tied"), [("adamw", True), ("sgd", False)], ids=["adamw-tied", "sgd-untied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_spilled_training_is_plain_pytorch_bit_for_bit(
    family: str, kind: str, tied: bool, tokens_path: Path, tmp_path: Path, shm_dir: Path
) -> None:
    spec = family_spec(tokens_path, family, tied=tied, optimizer=OPTIMIZERS[kind])
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    plan = trial_create(spec=spec, spill_dir=shm_dir, trial_id="t", device=CPU, cuts=[0, 2, 4])
    assert len(plan.shards) == 3
    results = run_all(TrialSession.open(spill_dir=shm_dir, trial_id="t", device=CPU))
    TrialSession.open(spill_dir=shm_dir, trial_id="t", device=CPU).export(tmp_path / "final")

    assert [r.loss for r in results if r.loss is not None] == reference.losses
    assert [r.eval_loss for r in results if r.eval_loss is not None] == reference.eval_losses
    assert_bit_identical(exported_weights(tmp_path / "final"), reference.weights)
    assert ("lm_head.weight" in reference.weights) == (not tied)
    assert architecture_from_spec(spec.model).n_params == sum(w.numel() for w in reference.weights.values())


# -- export, pretrained directories and the command line -----------------------------------------------------

CORPUS = "Shards spill to host memory and come back for their units; every family trains the same way. " * 40


@pytest.fixture(scope="module")
def corpus_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """Tokens of a local corpus and the directory of the bare ``tokenizer.json`` (a BPE trained on it)."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "corpus.txt").write_text(CORPUS)
    tokens, vocab = tokenize_corpus(root / "corpus.txt", root / "data", vocab_size=300)
    return tokens, root / "data", vocab


def corpus_spec(family: str, tokens: Path, tokenizer_dir: Path, vocab: int, *, tied: bool, **model: Any) -> TrialSpec:
    spec = family_spec(tokens, family, tied=tied, steps=2, eval_every=2)
    return dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, vocab_size=vocab, **model),
        data=DataSpec(tokens_path=str(tokens), seq_len=SEQ, tokenizer_dir=str(tokenizer_dir)))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_loads_and_generates_with_its_tokenizer(
    family: str, corpus_data: tuple[Path, Path, int], tmp_path: Path
) -> None:
    tokens, tokenizer_dir, vocab = corpus_data
    tied = family in ("gpt2", "qwen3")
    spec = corpus_spec(family, tokens, tokenizer_dir, vocab, tied=tied)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 3])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    engine_eval = [r.eval_loss for r in run_all(session) if r.eval_loss is not None]
    session.export(tmp_path / "out")

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    assert type(model).__name__ == CAUSAL_LM_CLASSES[family]
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    batch = TokenBlocks(spec.data, vocab_size=vocab).eval_batch(batch=0, batch_size=spec.micro_batch_size)
    with torch.no_grad():  # an evaluation's loss: its summed token losses over the tokens it predicts
        summed = model(batch, labels=batch, num_items_in_batch=1).loss.item()
    assert summed / batch[:, 1:].numel() == engine_eval[0]

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    assert tokenizer.eos_token == "<|endoftext|>"  # the corpus BPE's document end, so that generation stops there
    assert tokenizer("Shards spill")["input_ids"] == Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(
        "Shards spill").ids
    prompt = tokenizer("Shards spill to", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 4
    assert tokenizer.decode(generated[0]).startswith("Shards spill to")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trial_starts_from_a_pretrained_directory_of_any_family(
    family: str, corpus_data: tuple[Path, Path, int], tmp_path: Path
) -> None:
    tokens, tokenizer_dir, vocab = corpus_data
    spec = corpus_spec(family, tokens, tokenizer_dir, vocab, tied=family != "llama")
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="a", device=CPU, cuts=[0, 2])
    TrialSession.open(spill_dir=tmp_path, trial_id="a", device=CPU).export(tmp_path / "a")

    # The directory's config wins: family, sizes and head; a save_pretrained tokenizer is copied as it is; a
    # checkpoint stored for bf16 trains, and is exported, in fp32.
    shutil.copytree(tmp_path / "a", tmp_path / "a-bf16")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    (tmp_path / "a-bf16" / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    pretrained = dataclasses.replace(spec, model=ModelSpec(pretrained_dir=str(tmp_path / "a-bf16")),
                                     data=dataclasses.replace(spec.data, tokenizer_dir=str(tmp_path / "a-bf16")))
    assert architecture_from_spec(pretrained.model) == architecture_from_spec(spec.model)
    trial_create(spec=pretrained, spill_dir=tmp_path, trial_id="b", device=CPU, cuts=[0])
    TrialSession.open(spill_dir=tmp_path, trial_id="b", device=CPU).export(tmp_path / "b")

    assert_bit_identical(exported_weights(tmp_path / "b"), exported_weights(tmp_path / "a"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()


def test_an_unknown_architecture_is_refused_by_name_before_anything_runs(tokens_path: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "foo"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(
        {"model_type": "foo", "architectures": ["FooForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2}))
    spec = tiny_spec(tokens_path, model=ModelSpec(pretrained_dir=str(checkpoint)))
    with pytest.raises(UnknownArchitecture, match="'FooForCausalLM' \\(model_type 'foo'\\) is not supported"):
        trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    assert not (tmp_path / "spill").exists()
    with pytest.raises(SpecError, match="model family 'foo' is not supported; supported: gpt2, llama"):
        ModelSpec(family="foo")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="n_kv_head 3 must divide n_head 4"):
        ModelSpec(family="llama", n_head=4, n_kv_head=3)
    no_tokenizer = dataclasses.replace(tiny_spec(tokens_path), data=DataSpec(
        tokens_path=str(tokens_path), seq_len=SEQ, tokenizer_dir=str(checkpoint)))
    with pytest.raises(SpecError, match=r"holds no tokenizer\.json"):  # the export would need it after training
        trial_create(spec=no_tokenizer, spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    assert not (tmp_path / "spill").exists()


def test_the_command_line_trains_a_family_and_continues_from_its_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    common = ["--corpus", str(corpus), "--seq-len", "16", "--batch-size", "2", "--steps", "2", "--eval-every", "0",
              "--spill-dir", str(tmp_path / "spill"), "--device", "cpu", "--no-progress"]
    main([*common, "--trial-id", "scratch", "--family", "qwen3", "--n-layer", "2", "--n-embd", "32", "--n-head", "4",
          "--n-kv-head", "2", "--n-inner", "40", "--untied", "--vocab-size", "300", "--export", str(tmp_path / "a")])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a", local_files_only=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.num_key_value_heads == 2 and model.config.intermediate_size == 40
    assert not model.config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a", local_files_only=True)

    main([*common, "--trial-id", "continued", "--pretrained-dir", str(tmp_path / "a"), "--export", str(tmp_path / "b")])
    continued = TrialSession.open(spill_dir=tmp_path / "spill", trial_id="continued", device=CPU).spec
    assert continued.data.tokenizer_dir == str(tmp_path / "a")  # the pretrained model's own tokenizer
    assert np.load(continued.data.tokens_path).tolist() == tokenizer(CORPUS)["input_ids"]
    assert AutoTokenizer.from_pretrained(tmp_path / "b", local_files_only=True).get_vocab() == tokenizer.get_vocab()

    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--trial-id", "bad", "--tokenizer-dir", str(tmp_path), "--family", "llama"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main([*common, "--trial-id", "bad", "--family", "gpt2", "--n-kv-head", "2"])
    assert capsys.readouterr().err.splitlines()[-2:] == [
        f"error: --tokenizer-dir {tmp_path} holds no tokenizer.json",
        "error: GPT-2 has no grouped-query attention: n_kv_head must be unset or equal n_head"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_the_streamed_init_is_the_familys(family: str) -> None:
    stack = build_layer_stack(ModelSpec(family=family, n_layer=2, n_embd=128, n_head=4, n_kv_head=2,
                                        vocab_size=512, n_positions=64, tie_word_embeddings=False))
    std = stack.config.initializer_range
    for index in range(len(stack)):
        for ref, tensor in zip(stack.owned[index], init_layer(stack, index, seed=0), strict=True):
            if "norm" in ref.name:  # RMSNorms (Qwen3's q/k norms included) start at one
                assert torch.equal(tensor, torch.ones_like(tensor)), ref.name
            elif ref.name.endswith("bias"):  # Qwen2's q/k/v biases start at zero
                assert not tensor.any(), ref.name
            else:
                assert abs(tensor.std().item() - std) < 0.1 * std and abs(tensor.mean().item()) < 0.1 * std, ref.name
