"""The tokenizer that goes with a trial's exported model, so that the model can be used: for generating on its
page and in its download.

An export carries its tokenizer when the engine copied the trial's ``DataSpec.tokenizer_dir`` into it. An
export made before that carries none: its tokenizer is then the one its tokens were made with, the trial
spec's ``tokenizer_dir`` when that still exists, else its dataset's ``tokenizer.json``, written out with a
``tokenizer_config.json`` that makes ``AutoTokenizer`` load it as a fast tokenizer (`fallback_files`). The
files a tokenizer directory consists of are the engine's list (`worker.engine.tokenizer.TOKENIZER_FILES`, the
one the export copies). Plain files only (no transformers), so that the web process may call it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from webapp.ground.models import Trial
from webapp.worker_door import (
    CHECKPOINT_JSON_MAX_BYTES,
    END_OF_TEXT,
    TOKENIZER_CONFIG,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    TOKENIZER_JSON_MAX_BYTES,
    CheckpointError,
    checkpoint_file,
    read_limited,
)

log = logging.getLogger(__name__)


def has_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer ``AutoTokenizer.from_pretrained`` can load."""
    return (directory / TOKENIZER_JSON).is_file() or (directory / TOKENIZER_CONFIG).is_file()


def fallback_files(trial: Trial, *, context: int | None) -> dict[str, bytes]:
    """The tokenizer files to put beside `trial`'s exported model, which has none of its own: name -> content.
    `context` is the model's context length in tokens (the tokenizer's ``model_max_length``). Empty when the
    tokenizer is gone too (the dataset was tokenized again, or its files deleted), or when a file of it is
    not the directory's own (a symbolic link leads it out: the files go into a download) or is larger than a
    tokenizer's file can be."""
    spec_dir = ((trial.spec or {}).get("data") or {}).get("tokenizer_dir")
    if spec_dir and has_tokenizer(Path(spec_dir)):
        directory = Path(spec_dir)
        try:
            paths = {name: checkpoint_file(directory, name) for name in TOKENIZER_FILES}
            files = {name: read_limited(path, limit=TOKENIZER_JSON_MAX_BYTES)
                     for name, path in paths.items() if path.is_file()}
        except CheckpointError as error:
            log.warning("trial %s's tokenizer is not exported: %s", trial.pk, error)
            return {}
        if TOKENIZER_CONFIG in files:
            return files
        return _with_config(files, context=context)
    path = trial.experiment.dataset.tokenizer_path
    if not path.is_file():
        return {}
    return _with_config({TOKENIZER_JSON: path.read_bytes()}, context=context)


def _with_config(files: dict[str, bytes], *, context: int | None) -> dict[str, bytes]:
    """`files` (a bare ``tokenizer.json``) and the config that loads it as a ``PreTrainedTokenizerFast``."""
    if TOKENIZER_JSON not in files:
        return {}
    try:
        added = {token.get("content") for token in json.loads(files[TOKENIZER_JSON]).get("added_tokens") or []}
    except (ValueError, AttributeError):
        return {}
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if END_OF_TEXT in added:  # the dataset tokenizer's one special token ends (and starts) a text, as in GPT-2
        config.update(bos_token=END_OF_TEXT, eos_token=END_OF_TEXT, unk_token=END_OF_TEXT)
    if context:
        config["model_max_length"] = context
    return {**files, TOKENIZER_CONFIG: json.dumps(config, indent=2).encode()}


def model_context(directory: Path) -> int | None:
    """The context length (in tokens) of the model whose ``config.json`` is in `directory`, when it says."""
    try:
        config = json.loads(read_limited(directory / "config.json", limit=CHECKPOINT_JSON_MAX_BYTES))
    except (CheckpointError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
