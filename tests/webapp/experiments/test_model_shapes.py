"""A pretrained directory's config.json: read within bounds, any bad content a ModelChoiceError on the field; a
Llama-style config gives its family's shape, and the tokenizer beside it is fingerprinted."""

from __future__ import annotations

import hashlib
import json

import pytest

from webapp.experiments.model_shapes import MAX_CONFIG_BYTES, ModelChoiceError, pretrained_shape

GOOD = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 128, "vocab_size": 512}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[" * 100_000, "nested too deep"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(GOOD | {"n_layer": float("inf")}), "n_layer must be a positive integer, got inf"),
        (json.dumps(GOOD | {"model_type": "x" * 100_000}), "has model_type 'xxxx"),
        (json.dumps(GOOD | {"model_type": [[1] * 100] * 100}), "has model_type a list;"),
        (json.dumps(GOOD | {"padding": "x" * MAX_CONFIG_BYTES}), "over 1 MiB"),
        ("{", "no readable config.json"),
    ],
    ids=["deep", "list", "infinite", "long-type", "list-type", "huge", "broken"],
)
def test_it_refuses_a_bad_config_with_a_short_message(tmp_path, content, words):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelChoiceError) as caught:
        pretrained_shape(tmp_path)
    assert words in str(caught.value)
    assert caught.value.field == "pretrained_dir"
    assert len(str(caught.value)) < 300


def test_it_reads_a_good_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GOOD))
    shape = pretrained_shape(tmp_path)
    assert (shape.n_layer, shape.n_embd, shape.vocab_size) == (2, 32, 512)


def test_it_reads_a_llama_config_and_fingerprints_its_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 3, "hidden_size": 48, "num_attention_heads": 6,
        "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 512, "vocab_size": 700,
        "tie_word_embeddings": True}))
    shape = pretrained_shape(tmp_path)
    assert (shape.family, shape.n_layer, shape.n_embd, shape.n_head, shape.n_kv_head, shape.n_inner) == (
        "llama", 3, 48, 6, 2, 96)
    assert (shape.n_positions, shape.vocab_size, shape.tokenizer_sha256) == (512, 700, None)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert pretrained_shape(tmp_path).tokenizer_sha256 == hashlib.sha256(b"{}").hexdigest()


def test_it_names_an_architecture_hydra_does_not_train(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ModelChoiceError, match="has model_type 'bert'; Hydra trains gpt2, llama, mistral"):
        pretrained_shape(tmp_path)
