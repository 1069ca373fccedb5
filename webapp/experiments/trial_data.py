"""Which data a trial trains on, and which tokenizer made it.

A text corpus trains as token blocks; instruction and chat data train as examples (an example set, see
`worker.engine.examples`). A model trained from scratch learns the dataset's own tokenizer's ids
(``tokens.npy``, or the ``examples/`` set rendered with ChatML, with ``tokenizer.json`` beside them). A
pretrained model knows only its own tokenizer's ids, so its trials train on the dataset tokenized with that
tokenizer (for instruction data, rendered with the experiment's chat template, else the checkpoint's, else
ChatML): a `DatasetTokens` row per dataset, tokenizer and template, computed once by the web worker and shared
by every experiment that asks. Its trials are launched at once but sent to the scheduler only when those ids
are ready (`data_waiting`, checked by `launching.trial_send`), and fail if they could not be made; what
depends on the ids (the held-out set, an epoch's length) is completed then (`sent_data_fields`). Either way
the trial's spec names the tokenizer's directory, which the engine copies into the exported model, and for
examples the chat template the export must write into it when that tokenizer carries none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from webapp.datasets.models import Dataset, DatasetTokens, template_sha256
from webapp.datasets.services import dataset_tokens_request
from webapp.experiments.chat_template import default_chat_template, has_own_template
from webapp.experiments.model_shapes import ModelChoiceError, ModelShape, model_shape
from webapp.ground.models import Experiment


class TrialDataError(ValueError):
    """Data a trial cannot train on as its values ask (its sequence length drops every example of a split);
    the message says what to change."""


@dataclass(frozen=True)
class TrialData:
    """Where a trial reads its token ids: `tokens_path` (token blocks) or `examples_dir` (examples, whose first
    `train_examples` train: the count once `token_set` is ready, the dataset's own until then). `token_set`
    is None for the dataset's own ids, else the pretrained tokenizer's (maybe not ready). `chat_template` is
    the template the examples are rendered with when the tokenizer in `tokenizer_dir` carries none. `pairs`: the
    examples are a preference dataset's pair set (`worker.engine.pairs`), whose `train_examples` counts pairs."""

    tokenizer_dir: Path
    token_set: DatasetTokens | None
    tokens_path: Path | None = None
    examples_dir: Path | None = None
    train_examples: int = 0
    chat_template: str | None = None
    pairs: bool = False

    @property
    def is_ready(self) -> bool:
        return self.token_set is None or self.token_set.is_ready

    def holdout_rows(self, seq_len: int) -> int | None:
        """The rows of the final evaluation of a trial of `seq_len` (see `example_rows`); None until the
        examples are made. Raises TrialDataError."""
        if self.examples_dir is None or not self.is_ready:
            return None
        return example_rows(examples_dir=self.examples_dir, train_examples=self.train_examples, seq_len=seq_len,
                            pairs=self.pairs)


def trial_data(*, shape: ModelShape, dataset: Dataset, chat_template: str = "") -> TrialData:
    """Where `shape`'s trials on `dataset` read their data (paths that exist once they are ready), the
    examples rendered with `chat_template` (empty: the tokenizer's own, else ChatML) on a pretrained model."""
    if shape.tokenizer_sha256 is None or shape.tokenizer_dir is None:
        if dataset.is_instruction:
            return TrialData(dataset.directory, None, examples_dir=dataset.examples_dir,
                             train_examples=dataset.train_examples, chat_template=default_chat_template(),
                             pairs=dataset.is_preference)
        return TrialData(dataset.directory, None, tokens_path=dataset.tokens_path)
    template = chat_template if dataset.is_instruction else ""
    token_set = DatasetTokens.objects.filter(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256,
                                             template_sha256=template_sha256(template)).first()
    tokenizer_dir = Path(shape.tokenizer_dir)
    if not dataset.is_instruction:
        path = (token_set or DatasetTokens(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256)).path
        return TrialData(tokenizer_dir, token_set, tokens_path=path)
    if not template and not has_own_template(tokenizer_dir):
        template = default_chat_template()  # what the dataset side renders with; the export must carry it
    ready = token_set is not None and token_set.is_ready
    return TrialData(tokenizer_dir, token_set, examples_dir=token_set.examples_dir if token_set else None,
                     train_examples=token_set.train_examples if ready else dataset.train_examples,
                     chat_template=template or None, pairs=dataset.is_preference)


def trial_data_request(*, shape: ModelShape, dataset: Dataset, chat_template: str = "") -> DatasetTokens | None:
    """Ask the web worker for `shape`'s tokens of `dataset` (instruction data: rendered with `chat_template`)
    unless they exist (None: the dataset's own serve)."""
    if shape.tokenizer_sha256 is None or shape.tokenizer_dir is None:
        return None
    return dataset_tokens_request(dataset=dataset, tokenizer_sha256=shape.tokenizer_sha256,
                                  tokenizer_dir=shape.tokenizer_dir, model_name=shape.model_name or "the model",
                                  chat_template=chat_template if dataset.is_instruction else "")


@dataclass(frozen=True)
class EpochSize:
    """What one epoch over a training split holds, for an epoch budget: ``tokens`` (a corpus, read in blocks of
    the trial's sequence length), or ``examples`` (instruction data)."""

    tokens: int = 0
    examples: int | None = None

    def rows(self, seq_len: int) -> float:
        """Rows of `seq_len` tokens an epoch takes. For examples, one example a row: an estimate, the most
        rows an epoch takes (packing puts several examples in a row, and examples longer than `seq_len` are
        dropped; how many rows that leaves is known only once the engine lays the epoch out)."""
        return self.examples if self.examples is not None else self.tokens / seq_len


def epoch_size_of(*, dataset: Dataset, token_set: DatasetTokens | None) -> EpochSize:
    """The training split of the dataset's own ids, or of `token_set`'s once it is ready (an estimate until
    then, from the dataset's own: the send recomputes an epoch budget's steps from the real count)."""
    ready = token_set is not None and token_set.is_ready
    if dataset.is_instruction:
        train = token_set.train_examples if ready else dataset.train_examples
        return EpochSize(examples=2 * train if dataset.is_preference else train)  # a pair takes two rows
    return EpochSize(tokens=token_set.train_tokens if ready else dataset.train_tokens)


def epoch_size(*, shape: ModelShape, dataset: Dataset, chat_template: str = "") -> EpochSize:
    """The training split `shape`'s trials on `dataset` count an epoch budget in (see `epoch_size_of`)."""
    token_set = trial_data(shape=shape, dataset=dataset, chat_template=chat_template).token_set
    return epoch_size_of(dataset=dataset, token_set=token_set)


def example_rows(*, examples_dir: Path, train_examples: int, seq_len: int, pairs: bool = False) -> int:
    """The validation examples of the set in `examples_dir` (those from `train_examples` on) at most `seq_len`
    tokens long: the engine drops longer ones, and its final evaluation covers the rest, one a row
    (``DataSpec.holdout_rows``). For a pair set (`pairs`; `train_examples` counts pairs) a pair fits when both
    its sequences do, and each held-out pair that fits takes two rows. Raises TrialDataError when `seq_len`
    drops every training or every validation example (pair)."""
    try:
        lengths = np.diff(np.load(examples_dir / "starts.npy"))
    except (OSError, ValueError) as error:
        raise TrialDataError(f"the examples at {examples_dir} cannot be read ({type(error).__name__}); retry the "
                             "trial once the dataset is tokenized again.") from None
    item = "example"
    if pairs:
        if len(lengths) % 2:
            raise TrialDataError(f"the pair set at {examples_dir} holds an odd number of sequences; retry the trial "
                                 "once the dataset is tokenized again.")
        lengths, item = lengths.reshape(-1, 2).max(axis=1), "pair"  # a pair is as long as its longer sequence
    for split, part in (("training", lengths[:train_examples]), ("validation", lengths[train_examples:])):
        if len(part) and int(part.min()) > seq_len:
            raise TrialDataError(
                f"max_seq_len {seq_len} drops every {split} {item} (the shortest has {int(part.min())} tokens; "
                f"longer {item}s are dropped, never cut). Raise seq_len (max_seq_len) to at least "
                f"{int(part.min())}.")
    return (2 if pairs else 1) * int((lengths[train_examples:] <= seq_len).sum())


def heldout_data(*, dataset: Dataset, token_set: DatasetTokens | None, holdout_bytes: int | None) -> dict[str, object]:
    """The engine's held-out fields of a trial's token blocks (``DataSpec.val_start``, ``token_bytes_path``,
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


def sent_data_fields(*, data: dict[str, Any], dataset: Dataset, token_set: DatasetTokens | None,
                     holdout_bytes: int | None) -> dict[str, object]:
    """The fields of a trial's spec ``data`` that depend on its ids, from the ids now that they are ready:
    token blocks' held-out set (`heldout_data`), or the examples' training count and held-out rows. Raises
    TrialDataError when the trial's sequence length drops every example of a split."""
    if not data.get("examples_dir"):
        return heldout_data(dataset=dataset, token_set=token_set, holdout_bytes=holdout_bytes)
    train = dataset.train_examples if token_set is None else token_set.train_examples
    return {"train_examples": train,
            "holdout_rows": example_rows(examples_dir=Path(data["examples_dir"]), train_examples=train,
                                         seq_len=data["seq_len"], pairs=bool(data.get("pairs")))}


def check_ids(*, shape: ModelShape, dataset: Dataset, field: str, chat_template: str = "") -> None:
    """Raise ModelChoiceError (on `field`) when the ids the trials would read do not index `shape`'s embeddings:
    a pretrained model without a tokenizer of its own, or whose tokenizer makes ids past its vocabulary."""
    if shape.pretrained_dir is None:
        return  # a model from scratch gets the dataset's vocabulary
    name = shape.model_name or Path(shape.pretrained_dir).name
    if shape.tokenizer_sha256 is None:
        raise ModelChoiceError(
            f"{name} has no tokenizer (tokenizer.json) of its own, so the dataset's token ids would not match its "
            "embeddings. Add its tokenizer to the model's directory, or train a model from scratch.", field=field)
    token_set = trial_data(shape=shape, dataset=dataset, chat_template=chat_template).token_set
    if token_set is not None and token_set.is_ready and token_set.max_id >= shape.vocab_size:
        raise ModelChoiceError(ids_past_vocabulary(token_set, shape.vocab_size), field=field)


def ids_past_vocabulary(token_set: DatasetTokens, vocab_size: int) -> str:
    return (f"{token_set.model_name}'s tokenizer gives {token_set.dataset.name} ids up to {token_set.max_id}, but "
            f"the model has only {vocab_size} embeddings: they would not match. Choose a checkpoint whose "
            "tokenizer fits its embeddings.")


def token_set_at(*, dataset: Dataset, tokens_path: str) -> DatasetTokens | None:
    """The dataset's token ids of a pretrained tokenizer that a trial's spec reads at `tokens_path`."""
    return next((t for t in dataset.token_sets.all() if str(t.path) == tokens_path), None)


def token_set_of(*, dataset: Dataset, data: dict[str, Any]) -> DatasetTokens | None:
    """The dataset's ids of a pretrained tokenizer that a trial's spec ``data`` reads (token blocks or
    examples); None for the dataset's own, or ids deleted since."""
    if data.get("examples_dir"):
        return next((t for t in dataset.token_sets.all() if str(t.examples_dir) == data["examples_dir"]), None)
    return token_set_at(dataset=dataset, tokens_path=data["tokens_path"])


def data_waiting(*, data: dict[str, Any], dataset: Dataset, vocab_size: int) -> tuple[str, bool] | None:
    """None when the ids a trial's spec ``data`` reads are ready to train on; else why not and whether that is
    final (the tokenization failed, or its ids are past the model's `vocab_size`). The dataset's own are ready
    (experiments train on ready datasets)."""
    if data.get("examples_dir") == str(dataset.examples_dir) or data.get("tokens_path") == str(dataset.tokens_path):
        return None
    token_set = token_set_of(dataset=dataset, data=data)
    if token_set is None:
        where = data.get("examples_dir") or data.get("tokens_path")
        return f"The dataset's tokens at {where} are gone; retry the trial.", True
    tokenizer = f"{token_set.model_name}'s tokenizer{' and the chat template' if token_set.chat_template else ''}"
    if token_set.status == DatasetTokens.Status.FAILED:
        return f"Tokenizing {dataset.name} with {tokenizer} failed: {token_set.message}", True
    if not token_set.is_ready:
        return f"Waiting for {dataset.name} to be tokenized with {tokenizer}.", False
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
    return trial_data(shape=shape, dataset=experiment.dataset, chat_template=experiment.chat_template).token_set
