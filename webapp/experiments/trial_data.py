"""Which token ids a trial trains on, and which tokenizer made them.

A model trained from scratch learns the dataset's own tokenizer's ids (``tokens.npy``, with ``tokenizer.json``
beside it). A pretrained model knows only its own tokenizer's ids, so its trials train on the dataset tokenized
with that tokenizer: a `DatasetTokens` row per dataset and tokenizer, computed once by the web worker and
shared by every experiment that asks. Its trials are launched at once but sent to the scheduler only when
those ids are ready (`data_waiting`, checked by `launching.trial_send`), and fail if they could not be made.
Either way the trial's spec names the tokenizer's directory, which the engine copies into the exported model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings

from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.services import dataset_tokens_request
from webapp.experiments.model_shapes import ModelChoiceError, ModelShape, model_shape
from webapp.experiments.models import Experiment


@dataclass(frozen=True)
class TrialData:
    tokens_path: Path
    tokenizer_dir: Path
    token_set: DatasetTokens | None  # None: the dataset's own ids; else the pretrained tokenizer's (maybe not ready)


def trial_data(*, shape: ModelShape, dataset: Dataset) -> TrialData:
    """Where `shape`'s trials on `dataset` read their token ids (a path that exists once they are ready)."""
    if shape.tokenizer_sha256 is None or shape.tokenizer_dir is None:
        return TrialData(dataset.tokens_path, dataset.directory, None)
    token_set = DatasetTokens.objects.filter(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256).first()
    path = (token_set or DatasetTokens(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256)).path
    return TrialData(path, Path(shape.tokenizer_dir), token_set)


def trial_data_request(*, shape: ModelShape, dataset: Dataset) -> DatasetTokens | None:
    """Ask the web worker for `shape`'s tokens of `dataset` unless they exist (None: the dataset's own serve)."""
    if shape.tokenizer_sha256 is None or shape.tokenizer_dir is None:
        return None
    return dataset_tokens_request(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256,
                                  tokenizer_dir=shape.tokenizer_dir, model_name=shape.model_name or "the model")


def train_tokens(*, shape: ModelShape, dataset: Dataset) -> int:
    """Training tokens for an epoch budget: the pretrained tokenizer's count once known, else the dataset's own
    (an estimate until then; the send recomputes the steps with the real count)."""
    token_set = trial_data(shape=shape, dataset=dataset).token_set
    return token_set.train_tokens if token_set is not None and token_set.is_ready else dataset.train_tokens


def heldout_data(*, dataset: Dataset, token_set: DatasetTokens | None, holdout_bytes: int | None) -> dict[str, object]:
    """The engine's held-out fields of a trial's data (``DataSpec.val_start``, ``token_bytes_path``,
    ``holdout_tokens``) for the dataset's own ids or `token_set`'s: the tokens from the validation text's first
    to its end, or to the last whose bytes fit in the first `holdout_bytes` bytes of it. Empty for a dataset
    split by blocks of tokens (tokenized before the split was defined on the text)."""
    val_start = dataset.val_start if token_set is None else token_set.val_start
    if dataset.val_offset is None or val_start is None:
        return {}
    n_tokens = dataset.n_tokens if token_set is None else token_set.n_tokens
    bytes_path = dataset.token_bytes_path if token_set is None else token_set.token_bytes_path
    has_bytes = bytes_path.exists()
    holdout_tokens = n_tokens - val_start
    if holdout_bytes is not None and has_bytes:
        covered = np.cumsum(np.load(bytes_path, mmap_mode="r")[val_start:], dtype=np.int64)
        holdout_tokens = int(np.searchsorted(covered, holdout_bytes, side="right"))
    return {"val_start": val_start, "token_bytes_path": str(bytes_path) if has_bytes else None,
            "holdout_tokens": max(2, min(holdout_tokens, n_tokens - val_start))}


def check_ids(*, shape: ModelShape, dataset: Dataset, field: str) -> None:
    """Raise ModelChoiceError (on `field`) when the ids the trials would read do not index `shape`'s embeddings:
    a pretrained model without a tokenizer of its own, or whose tokenizer makes ids past its vocabulary."""
    if shape.pretrained_dir is None:
        return  # a model from scratch gets the dataset's vocabulary
    name = shape.model_name or Path(shape.pretrained_dir).name
    if shape.tokenizer_sha256 is None:
        raise ModelChoiceError(
            f"{name} has no tokenizer (tokenizer.json) of its own, so the dataset's token ids would not match its "
            "embeddings. Add its tokenizer to the model's directory, or train a model from scratch.", field=field)
    token_set = trial_data(shape=shape, dataset=dataset).token_set
    if token_set is not None and token_set.is_ready and token_set.max_id >= shape.vocab_size:
        raise ModelChoiceError(ids_past_vocabulary(token_set, shape.vocab_size), field=field)


def ids_past_vocabulary(token_set: DatasetTokens, vocab_size: int) -> str:
    return (f"{token_set.model_name}'s tokenizer gives {token_set.dataset.name} ids up to {token_set.max_id}, but "
            f"the model has only {vocab_size} embeddings: they would not match. Choose a checkpoint whose "
            "tokenizer fits its embeddings.")


def token_set_at(*, dataset: Dataset, tokens_path: str) -> DatasetTokens | None:
    """The dataset's token ids of a pretrained tokenizer that a trial's spec reads at `tokens_path`."""
    return next((t for t in dataset.token_sets.all() if str(t.path) == tokens_path), None)


def data_waiting(*, tokens_path: str, dataset: Dataset, vocab_size: int) -> tuple[str, bool] | None:
    """None when the trial's ids at `tokens_path` are ready to train on; else why not and whether that is final
    (the tokenization failed, or its ids are past the model's `vocab_size`)."""
    if tokens_path == str(dataset.tokens_path):
        return None
    token_set = token_set_at(dataset=dataset, tokens_path=tokens_path)
    if token_set is None:
        return f"The dataset's tokens at {tokens_path} are gone; retry the trial.", True
    if token_set.status == DatasetTokens.Status.FAILED:
        return f"Tokenizing {dataset.name} with {token_set.model_name}'s tokenizer failed: {token_set.message}", True
    if not token_set.is_ready:
        return f"Waiting for {dataset.name} to be tokenized with {token_set.model_name}'s tokenizer.", False
    if token_set.max_id >= vocab_size:
        return ids_past_vocabulary(token_set, vocab_size), True
    return None


def experiment_tokens(*, experiment: Experiment) -> DatasetTokens | None:
    """The experiment's dataset as its pretrained model's tokenizer makes it (None: the dataset's own ids, or
    a model that is gone), for its page to say whether its trials wait for them."""
    try:
        shape = model_shape(experiment.model, models_root=settings.HYDRA.models_root)
    except ModelChoiceError:
        return None
    return trial_data(shape=shape, dataset=experiment.dataset).token_set
