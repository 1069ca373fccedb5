"""Instruction data for the experiment tests: a small chat dataset built by the dataset side's own build, as the
web worker builds it; a tiny catalog checkpoint whose tokenizer knows chat text, with or without a chat
template of its own; the checks of chat templates the forms asked for, done as the web worker does them; and
the held-out rows a trial must declare, counted from an example set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile

from tests.webapp.catalog.checkpoints import catalog_manager
from webapp.accounts.models import Team
from webapp.catalog.models import Checkpoint
from webapp.catalog.services import checkpoint_register
from webapp.catalog.work import checkpoint_import
from webapp.datasets.models import Dataset
from webapp.datasets.sample_chat import sample_chat_rows
from webapp.datasets.services import dataset_create, dataset_tokenize
from webapp.experiments.chat_template import chat_template_check
from webapp.ground.models import ChatTemplateCheck

CONVERSATIONS = 80  # of the built-in sample: 72 train, 8 validate


def chat_dataset(team: Team, name: str = "chat") -> Dataset:
    """A ready chat dataset (conversations of the built-in sample), tokenized here as the web worker would."""
    text = "".join(json.dumps(row) + "\n" for row in sample_chat_rows()[:CONVERSATIONS])
    dataset = dataset_create(team=team, user=None, name=name, corpus=ContentFile(text.encode()),
                             source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1,
                             filename=f"{name}.jsonl", kind=Dataset.Kind.MESSAGES)
    dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert dataset.is_ready, dataset.message
    return dataset


def chat_checkpoint(user: AbstractBaseUser, name: str = "chat llama", *, template: str | None = None) -> Checkpoint:
    """A ready catalog checkpoint added by `user`: a 2-layer Llama of 256 positions with a 300-token byte-level
    BPE trained on the sample's conversations in ChatML, carrying `template` in its ``tokenizer_config.json``
    when given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from worker.engine.tokenizer import train_tokenizer

    relative = name.replace(" ", "-")
    directory = Path(settings.HYDRA.models_root) / relative
    config = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=32, vocab_size=320, max_position_embeddings=256, tie_word_embeddings=True)
    directory.mkdir(parents=True)
    LlamaForCausalLM(config).save_pretrained(directory)
    corpus = directory.parent / f".{relative}-corpus.txt"
    corpus.write_text("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                              for row in sample_chat_rows() for m in row["messages"]))
    train_tokenizer(corpus, 300).save(str(directory / "tokenizer.json"))
    corpus.unlink()
    if template is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": template}))
    checkpoint = checkpoint_register(actor=catalog_manager(user), name=name, path=relative)
    checkpoint_import(checkpoint_id=checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == Checkpoint.Status.READY, checkpoint.message
    return checkpoint


def templates_checked() -> int:
    """Check every chat template waiting for its check, with the web worker's own task; returns how many."""
    waiting = list(ChatTemplateCheck.objects.filter(status=ChatTemplateCheck.Status.CHECKING).values_list(
        "pk", flat=True))
    for check_id in waiting:
        chat_template_check(check_id=check_id)
    return len(waiting)


def lengths(examples_dir: Path | str) -> np.ndarray:
    """The token count of each example of the set in `examples_dir`."""
    return np.diff(np.load(Path(examples_dir) / "starts.npy"))


def fitting_validation(examples_dir: Path | str, *, train_examples: int, seq_len: int) -> int:
    """How many validation examples (from `train_examples` on) a row of `seq_len` tokens holds."""
    return int((lengths(examples_dir)[train_examples:] <= seq_len).sum())
