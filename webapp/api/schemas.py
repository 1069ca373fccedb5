"""What the API returns: one schema per resource, read from the models by name."""

from datetime import datetime
from typing import Any

from ninja import Field, Schema


class ErrorOut(Schema):
    detail: str
    errors: dict[str, list[str]] = {}


class TeamOut(Schema):
    id: int
    name: str
    role: str


class MeOut(Schema):
    username: str
    team: TeamOut | None
    teams: list[TeamOut]
    token: str
    scope: str
    token_expires: datetime


class DatasetOut(Schema):
    id: int
    name: str
    kind: str
    columns: dict[str, str]
    source: str
    status: str
    message: str
    vocab_size: int
    val_fraction: float
    n_bytes: int
    n_tokens: int
    n_rows: int = Field(description="Instruction data and preference pairs: the file's rows, good and bad.")
    n_bad_rows: int = Field(description="Rows that are no example or pair (each one's reason is in the preview).")
    n_examples: int = Field(description="Examples (preference data: pairs) tokenized, training and validation.")
    train_examples: int = Field(description="Examples or pairs of the training split (the first of the set).")
    created: datetime


class CheckpointOut(Schema):
    id: int
    name: str
    family: str
    status: str
    n_params: int | None
    context_length: int | None
    vocab_size: int | None


class ExperimentOut(Schema):
    id: int
    name: str
    dataset: int
    dataset_name: str
    status: str
    model: dict[str, Any]
    strategy: str
    n_trials: int
    budget_unit: str
    budget: float
    eval_every: int
    seed: int
    priority: str
    max_devices_per_trial: int | None = None  # None: as many devices as a trial has micro-batches
    objective: str = "sft"  # sft: the language-modelling loss; dpo: DPO on a preference dataset's pairs
    dpo_beta: dict[str, Any] | None = None  # objective dpo: the searched beta (a search-space dimension)
    dpo_loss_type: dict[str, Any] | None = None  # ... and loss type
    trials: dict[str, int]
    created: datetime
    launched: datetime | None
    cloned_from: int | None
    tags: list[str]


class TrialOut(Schema):
    id: int
    experiment: int
    number: int
    status: str
    message: str
    params: dict[str, Any]
    attempt: int
    step: int
    total_steps: int
    remaining_s: float | None
    best_val_loss: float | None
    best_val_ppl: float | None
    final_bpb: float | None
    final_loss: float | None
    final_reward_accuracy: float | None = None  # DPO: the final evaluation's preference accuracy
    final_reward_margin: float | None = None  # DPO: its mean reward margin
    actions: list[str]
    plan: dict[str, Any] | None
    created: datetime
    updated: datetime  # pass the largest seen as ``updated_since``
    started: datetime | None
    finished: datetime | None


class StepOut(Schema):
    step: int
    loss: float
    lr: float
    tokens: int
    time: float
    rewards_chosen: float | None = None  # DPO: the batch's mean implicit rewards and preference accuracy
    rewards_rejected: float | None = None
    reward_accuracy: float | None = None


class EvalOut(Schema):
    step: int
    loss: float
    perplexity: float
    bpb: float | None
    time: float
    rewards_chosen: float | None = None  # DPO: the held-out pairs' rewards, margin and preference accuracy
    rewards_rejected: float | None = None
    reward_margin: float | None = None
    reward_accuracy: float | None = None


class MetricsOut(Schema):
    trial: TrialOut
    steps: list[StepOut]
    evals: list[EvalOut]
    next: int  # pass as ``since`` to get only what came after


class ArchiveOut(Schema):
    kind: str = "model"
    status: str
    message: str = ""
    size_bytes: int | None = None
    total_bytes: int | None = None
    packed_bytes: int = 0
    download: str | None = None


class DownloadOut(ArchiveOut):
    title: str
    about: str
    content_bytes: int


class GenerationOut(Schema):
    id: int
    status: str
    prompt: str
    text: str
    message: str


class PreviewTrialOut(Schema):
    number: int
    params: dict[str, Any]
    total_steps: int
    plan: dict[str, Any] | None


class PreviewOut(Schema):
    status: str
    id: int | None = None
    message: str = ""
    budget_bytes: int | None = None
    trials: list[PreviewTrialOut] = []


class CountOut(Schema):
    count: int
    detail: str
