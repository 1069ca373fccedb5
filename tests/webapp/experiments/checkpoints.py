"""Pretrained models for the experiment tests: tiny catalog checkpoints registered and checked for real (the
catalog's own check, run here as the web worker would), and bare model directories as older experiments named
them. Built from configs and a tokenizer trained here; nothing comes from a hub."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from tests.webapp.catalog.checkpoints import TEXT, catalog_manager, tiny_llama
from webapp.catalog.models import Checkpoint
from webapp.catalog.services import checkpoint_register
from webapp.catalog.work import checkpoint_import
from worker.engine.tokenizer import train_tokenizer


def ready_checkpoint(user: AbstractBaseUser, name: str = "tiny llama") -> Checkpoint:
    """A ready catalog checkpoint: a 2-layer Llama (64 positions, 320 embeddings, a 300-token tokenizer),
    added by `user`, made a catalog manager to add it."""
    relative = name.replace(" ", "-")
    tiny_llama(Path(settings.HYDRA.models_root) / relative)
    checkpoint = checkpoint_register(actor=catalog_manager(user), name=name, path=relative)
    checkpoint_import(checkpoint_id=checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == Checkpoint.Status.READY, checkpoint.message
    return checkpoint


def bare_model_dir(relative: str, *, vocab_size: int, tokenizer: bool) -> Path:
    """A Llama directory under the models root with a config (no weights: enough to plan), and a tokenizer of
    300 tokens when asked."""
    directory = Path(settings.HYDRA.models_root) / relative
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 128,
        "vocab_size": vocab_size, "tie_word_embeddings": True}))
    if tokenizer:
        train_tokenizer(TEXT, vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory
