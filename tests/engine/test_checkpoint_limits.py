"""What the engine reads of a checkpoint directory: its own files only, and each JSON file only up to its limit.

A ``config.json``, safetensors index or ``tokenizer.json`` larger than any real one is refused from its size
alone (the files here are sparse: gigabytes claimed, nothing allocated or read), with a
``CheckpointFileTooLarge`` naming the file, its size and the limit. A checkpoint checked, then swapped for a
symbolic link out of its place (the directory, one file of it, or an index entry naming a file outside) is
refused by everything that reads it for a trial (the check, the config reader, the weights, the shared base's
key, the exported tokenizer) with a ``CheckpointLinkError``, never followed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

from tests.webapp.catalog.checkpoints import tiny_llama
from worker.engine.checkpoint_files import CHECKPOINT_JSON_MAX_BYTES, TOKENIZER_JSON_MAX_BYTES
from worker.engine.checkpoints import check_checkpoint
from worker.engine.config import ModelSpec
from worker.engine.errors import CheckpointFileTooLarge, CheckpointLinkError, SpecError
from worker.engine.export import export_tokenizer
from worker.engine.families import read_config
from worker.engine.layers import build_layer_stack
from worker.engine.shared_base import content_key
from worker.engine.weights import PretrainedWeights

CLAIMED = 8 << 30  # a sparse file's size: nothing of it is on disk


def sparse(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)
    with path.open("wb") as file:
        file.truncate(size)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return tiny_llama(tmp_path / "models" / "tiny")


@pytest.mark.parametrize(("name", "limit"), [
    ("config.json", CHECKPOINT_JSON_MAX_BYTES),
    ("model.safetensors.index.json", CHECKPOINT_JSON_MAX_BYTES),
    ("tokenizer.json", TOKENIZER_JSON_MAX_BYTES),
])
def test_the_check_refuses_an_oversized_file_from_its_size(checkpoint: Path, name: str, limit: int) -> None:
    sparse(checkpoint / name, CLAIMED)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFileTooLarge) as caught:
            check_checkpoint(checkpoint)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(f"{checkpoint / name} is {CLAIMED:,} bytes, over the {limit:,} bytes read")
    assert (caught.value.size_bytes, caught.value.limit_bytes) == (CLAIMED, limit)
    assert peak < 8 << 20


def test_a_file_just_over_the_limit_is_refused_and_one_at_it_is_read(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    text = json.dumps(config | {"padding": ""})
    exact = text.replace('"padding": ""', '"padding": "' + "x" * (CHECKPOINT_JSON_MAX_BYTES - len(text)) + '"')
    assert len(exact) == CHECKPOINT_JSON_MAX_BYTES
    (checkpoint / "config.json").write_text(exact)
    assert read_config(checkpoint)["padding"].startswith("x")
    (checkpoint / "config.json").write_text(exact + " ")
    with pytest.raises(CheckpointFileTooLarge, match=f"{CHECKPOINT_JSON_MAX_BYTES + 1:,} bytes"):
        read_config(checkpoint)


def test_the_trial_readers_refuse_oversized_json(checkpoint: Path) -> None:
    sparse(checkpoint / "model.safetensors.index.json", CLAIMED)
    with pytest.raises(CheckpointFileTooLarge, match=r"model\.safetensors\.index\.json is 8,589,934,592 bytes"):
        PretrainedWeights(checkpoint)
    sparse(checkpoint / "config.json", CLAIMED)
    with pytest.raises(CheckpointFileTooLarge, match=r"config\.json is 8,589,934,592 bytes"):
        read_config(checkpoint)


@pytest.mark.timeout(60)  # reading a FIFO's content blocks until a writer comes: without the check, forever
def test_a_fifo_in_place_of_the_config_is_refused_without_blocking(checkpoint: Path) -> None:
    (checkpoint / "config.json").unlink()
    os.mkfifo(checkpoint / "config.json")
    with pytest.raises(SpecError, match=r"has no config\.json"):
        read_config(checkpoint)


def swap_directory(checkpoint: Path, outside: Path) -> None:
    shutil.move(checkpoint, outside)
    checkpoint.symlink_to(outside)


def swap_file(checkpoint: Path, name: str, outside: Path) -> None:
    outside.mkdir(parents=True, exist_ok=True)
    shutil.move(checkpoint / name, outside / name)
    (checkpoint / name).symlink_to(outside / name)


def test_every_trial_reader_refuses_a_swapped_directory(checkpoint: Path, tmp_path: Path) -> None:
    check_checkpoint(checkpoint)
    swap_directory(checkpoint, tmp_path / "elsewhere")
    words = re.escape(f"{checkpoint} is not the checkpoint directory's real path")
    for read in (check_checkpoint, read_config, PretrainedWeights, content_key,
                 lambda path: build_layer_stack(ModelSpec(family="llama", pretrained_dir=str(path)))):
        with pytest.raises(CheckpointLinkError, match=words):
            read(checkpoint)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_every_trial_reader_refuses_a_swapped_file(checkpoint: Path, tmp_path: Path, name: str) -> None:
    swap_file(checkpoint, name, tmp_path / "elsewhere")
    words = re.escape(f"{checkpoint / name} leads out of the checkpoint directory")
    for read in (check_checkpoint, read_config, PretrainedWeights, content_key):
        with pytest.raises(CheckpointLinkError, match=words):
            read(checkpoint)


def test_an_index_naming_a_file_outside_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    shutil.move(checkpoint / "model.safetensors", tmp_path / "outside.safetensors")
    weights = {"weight_map": {"model.embed_tokens.weight": "../../outside.safetensors"}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(weights))
    for read in (check_checkpoint, PretrainedWeights):
        with pytest.raises(CheckpointLinkError, match=r"outside\.safetensors leads out of the checkpoint directory"):
            read(checkpoint)


def test_the_exported_tokenizer_takes_no_file_a_link_leads_out(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("not a tokenizer's")
    (checkpoint / "tokenizer_config.json").write_text("{}")
    (checkpoint / "special_tokens_map.json").symlink_to(tmp_path / "secret")
    out = tmp_path / "export"
    out.mkdir()
    with pytest.raises(CheckpointLinkError, match=r"special_tokens_map\.json leads out of the checkpoint directory"):
        export_tokenizer(checkpoint, out)
    assert not (out / "special_tokens_map.json").exists()
