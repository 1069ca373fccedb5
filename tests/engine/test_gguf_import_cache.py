"""Importing a GGUF file parses it once: the checkpoint written is the same, byte for byte, as the one the
import writes when transformers parses the file each time it reads it, and the gguf package is left as it was."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import gguf
import gguf.gguf_reader
import gguf.tensor_mapping
import pytest
import torch

from worker.engine import gguf_import
from worker.engine.checkpoints import smollm2_gguf_path

pytestmark = pytest.mark.slow  # a second import of the real SmolLM2 (about 15 s)


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_the_import_parsing_once_writes_the_same_checkpoint(smollm2_dir, tmp_path, monkeypatch):
    # The session's import (`smollm2_dir`) left the package's names on their own definitions.
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader
    assert gguf.get_tensor_name_map is gguf.tensor_mapping.get_tensor_name_map
    monkeypatch.setattr(gguf_import, "_parsed_once", contextlib.nullcontext)  # transformers' own three parses
    with torch.random.fork_rng(devices=[]):
        gguf_import.import_gguf(smollm2_gguf_path(), tmp_path / "plain")
    assert _digests(tmp_path / "plain") == _digests(smollm2_dir)
    assert "model.safetensors" in _digests(smollm2_dir)


def test_a_failed_import_leaves_the_gguf_package_as_it_was(tmp_path):
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 16)  # a header with no tensors nor metadata
    with pytest.raises(gguf_import.CheckpointError):
        gguf_import.import_gguf(broken, tmp_path / "out")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert not (tmp_path / "out").exists()
