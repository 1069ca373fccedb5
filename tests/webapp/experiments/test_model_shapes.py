"""A pretrained directory's config.json: read within bounds, any bad content a ModelChoiceError on the field."""

from __future__ import annotations

import json

import pytest

from webapp.experiments.model_shapes import MAX_CONFIG_BYTES, ModelChoiceError, pretrained_shape

GOOD = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 128, "vocab_size": 512}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[" * 100_000, "nested too deep"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(GOOD | {"n_layer": float("inf")}), "cannot convert float infinity"),
        (json.dumps(GOOD | {"model_type": "x" * 100_000}), "has model_type 'xxxx"),
        (json.dumps(GOOD | {"model_type": [[1] * 100] * 100}), "has model_type a list;"),
        (json.dumps(GOOD | {"padding": "x" * MAX_CONFIG_BYTES}), "over 1 MiB"),
        ("{", "no readable GPT-2 config.json"),
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
