"""Preference data for the experiment tests: a ready preference dataset whose pair set is encoded by the engine's
own `encode_pairs` with a catalog checkpoint's tokenizer (its ``examples/`` set, and the same pairs as that
checkpoint's `DatasetTokens` set, ready, as the web worker would leave them), so that DPO experiments on the
checkpoint train at once; a DPO experiment on them, made through the services; and the held-out rows a DPO
trial declares, counted from the pair set."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from tests.webapp.experiments.factories import make_experiment
from webapp.accounts.models import Team
from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import checkpoint_dir
from webapp.datasets.models import Dataset, DatasetTokens, template_sha256
from webapp.datasets.tokenization import token_byte_lengths
from webapp.experiments.model_shapes import checkpoint_shape
from webapp.ground.models import Experiment

ANIMALS = ("cat", "dog", "owl", "fox", "bee", "cow", "elk", "ant", "hen", "yak", "eel", "ram")
N_PAIRS, N_TRAIN = 24, 20  # 4 held out


def pair_rows() -> list[tuple[int, tuple, tuple, tuple]]:
    """(line, prompt, chosen, rejected) rows: a question about an animal, a right and a wrong answer."""
    rows = []
    for k in range(N_PAIRS):
        animal, other = ANIMALS[k % len(ANIMALS)], ANIMALS[(k + 5) % len(ANIMALS)]
        prompt = ({"role": "user", "content": f"Which animal is number {k}? Say {animal}."},)
        chosen = ({"role": "assistant", "content": f"It is the {animal}."},)
        rejected = ({"role": "assistant", "content": f"Maybe a {other}, or {'not ' * (k % 3)}sure."},)
        rows.append((k + 1, prompt, chosen, rejected))
    return rows


def preference_dataset(team: Team, checkpoint: Checkpoint, name: str = "prefs") -> Dataset:
    """A ready preference dataset of `N_PAIRS` pairs (the first `N_TRAIN` train), its pair set encoded with
    `checkpoint`'s tokenizer and ChatML, as its own ``examples/`` and as that tokenizer's ready token set."""
    from transformers import AutoTokenizer

    from worker.engine.chat import chat_tokenizer
    from worker.engine.pairs import encode_pairs, save_pairs

    directory = checkpoint_dir(checkpoint)
    pretrained = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    encoded = encode_pairs(chat_tokenizer(pretrained), pair_rows(),
                           byte_lengths=token_byte_lengths(pretrained.backend_tokenizer))
    assert not encoded.failed and len(encoded.examples) == 2 * N_PAIRS, encoded.failed
    text = repr(pair_rows()).encode()
    dataset = Dataset.objects.create(
        team=team, name=name, source=Dataset.Source.UPLOAD, kind=Dataset.Kind.PREFERENCE,
        status=Dataset.Status.READY, vocab_size=len(pretrained), val_fraction=(N_PAIRS - N_TRAIN) / N_PAIRS,
        n_bytes=len(text), n_tokens=len(encoded.examples.ids), n_rows=N_PAIRS, n_examples=N_PAIRS,
        train_examples=N_TRAIN, fingerprint=hashlib.sha256(text).hexdigest(), filename=f"{name}.jsonl")
    save_pairs(encoded.examples, dataset.examples_dir)
    shutil.copy(directory / "tokenizer.json", dataset.directory / Dataset.TOKENIZER_FILE)
    tokens = DatasetTokens.objects.create(
        dataset=dataset, tokenizer_sha256=checkpoint.tokenizer_sha256, tokenizer_dir=str(directory),
        model_name=checkpoint.name, template_sha256=template_sha256(""), status=DatasetTokens.Status.READY,
        n_tokens=len(encoded.examples.ids), max_id=int(encoded.examples.ids.max()), train_examples=N_TRAIN)
    shutil.copytree(dataset.examples_dir, tokens.examples_dir)
    return dataset


def held_out_rows(examples_dir: Path | str, *, seq_len: int) -> int:
    """The rows of a DPO trial's final evaluation: two for each held-out pair both of whose sequences fit."""
    lengths = np.diff(np.load(Path(examples_dir) / "starts.npy")).reshape(-1, 2)
    return 2 * int((lengths[N_TRAIN:].max(axis=1) <= seq_len).sum())


DPO_SPACE = {"dpo_beta": {"values": [0.1]}, "lora_r": {"values": [4]}, "batch_size": {"values": [4]},
             "seq_len": {"values": [78]}}


def dpo_experiment(team: Team, dataset: Dataset, checkpoint: Checkpoint, **fields: object) -> Experiment:
    """A DPO experiment of `team` on `dataset` and `checkpoint` (by default one LoRA trial of beta 0.1)."""
    values: dict[str, object] = {"space": DPO_SPACE, "objective": "dpo", "shape": checkpoint_shape(checkpoint.pk),
                                 "model": {"kind": "checkpoint", "checkpoint": checkpoint.pk,
                                           "checkpoint_name": checkpoint.name}}
    return make_experiment(team, dataset, **(values | fields))
