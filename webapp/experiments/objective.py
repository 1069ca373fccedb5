"""An experiment's objective: what its trials minimize, and the rules that tie it to the dataset and the model.

``sft`` is the language-modelling loss on the dataset's text or examples (every experiment's, by default).
``dpo`` is direct preference optimization (`worker.engine.dpo`, as TRL's ``DPOTrainer``) on a preference dataset's
pairs: each trial's spec gets ``dpo={beta, loss_type}`` from its ``dpo_beta`` and ``dpo_loss_type`` values, its
data ``pairs`` with the loss on the answers (``loss_on`` assistant), and a batch of ``batch_size`` rows holds
``batch_size / 2`` pairs, a pair's two rows in the same micro-batch. DPO measures the trained model against a
reference, the model it starts from, so it needs a pretrained checkpoint: a full fine-tune computes the
reference's log-probabilities of every pair once, in a first pass over the pairs, and keeps them on the host
(two numbers a pair; no second copy of the model), and a LoRA trial's reference is the shared base with its
adapters off, which costs one more forward of each shard without a graph.

Pure apart from the dataset and model it is given; every refusal is a `SearchSpaceError` on the parameter's row
or a `ModelChoiceError` on the form field to change, its message saying what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from webapp.experiments.model_shapes import ModelChoiceError, ModelShape
from webapp.experiments.search_space import PARAMETERS, SearchSpace, SearchSpaceError, Value
from webapp.worker_door import DpoSpec

if TYPE_CHECKING:
    from webapp.datasets.models import Dataset

SFT, DPO = "sft", "dpo"
OBJECTIVES = (SFT, DPO)
DPO_PARAMETERS = ("dpo_beta", "dpo_loss_type")  # searched only when the objective is dpo
DPO_PRUNER_METRICS = ("reward_accuracy", "reward_margin")  # evaluation figures only DPO trials have


def objective_of(raw: object, *, field: str = "objective") -> str:
    """The objective `raw` names (empty or None: sft); SearchSpaceError on `field` for anything else."""
    if raw is None or raw == "":
        return SFT
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text not in OBJECTIVES:
        shown = repr(raw)[:40] if isinstance(raw, str | int | float) else f"a {type(raw).__name__}"
        raise SearchSpaceError(f"objective: {shown} is not one of {', '.join(OBJECTIVES)} (sft: the "
                               "language-modelling loss; dpo: preference tuning on preference pairs).", field=field)
    return text


def check_objective(*, objective: str, dataset: Dataset, shape: ModelShape, space: SearchSpace,
                    pruner: dict[str, Any] | None = None) -> None:
    """Raise ModelChoiceError or SearchSpaceError when `objective` does not fit the dataset, the model, the search
    space or the pruner's metric (see the module docstring)."""
    if objective == DPO and not dataset.is_preference:
        raise ModelChoiceError(f"objective dpo trains on preference pairs, and {dataset.name} is "
                               f"{dataset.get_kind_display().lower()}. Choose a preference dataset, or objective "
                               "sft.", field="dataset")
    if objective != DPO and dataset.is_preference:
        raise ModelChoiceError(f"{dataset.name} holds preference pairs, which train with DPO: choose objective dpo "
                               "(a chosen and a rejected answer have no single text to model).", field="objective")
    if objective != DPO:
        _check_sft(space, pruner)
        return
    if shape.pretrained_dir is None:
        raise ModelChoiceError("objective dpo tunes a pretrained checkpoint against itself as the reference; a model "
                               "from scratch would be compared with random weights. Choose a checkpoint of the "
                               "catalog (a full fine-tune or LoRA adapters).", field="model_kind")
    loss_on = space.get("loss_on")
    if loss_on is not None and any(value != "assistant" for value in loss_on.values):
        raise SearchSpaceError("loss_on: DPO scores the answers of each pair, so loss_on stays assistant; remove this "
                               "row.", parameter="loss_on", field="values")
    check_even_batches(space)


def _check_sft(space: SearchSpace, pruner: dict[str, Any] | None) -> None:
    for name in DPO_PARAMETERS:
        dimension = space.get(name)
        if dimension is not None and any(value != PARAMETERS[name].default for value in dimension.grid_values()):
            raise SearchSpaceError(f"{name}: applies to objective dpo (preference tuning); this experiment's "
                                   "objective is sft. Remove this row, or choose objective dpo on a preference "
                                   "dataset.", parameter=name, field="values")
    metric = (pruner or {}).get("metric", "loss")
    if metric in DPO_PRUNER_METRICS:
        raise SearchSpaceError(f"pruner: the metric {metric} is a DPO trial's figure; an sft experiment's trials "
                               "are pruned by loss or bpb.", field="pruner_metric")


def check_even_batches(space: SearchSpace) -> None:
    """Every micro-batch a DPO space may draw holds an even number of rows (whole pairs, two rows each)."""
    batch, micro = space.get("batch_size"), space.get("micro_batches")
    if batch is not None and batch.kind != "categorical" and (int(batch.low or 0) % 2 or (batch.step or 1) % 2) \
            and batch.low != batch.high:
        raise SearchSpaceError(f"batch_size: a DPO batch holds whole pairs, two rows each; the range from "
                               f"{int(batch.low or 0)} in steps of {batch.step or 1} draws odd sizes. Give an even "
                               "low and an even step, or list even values.", parameter="batch_size", field="step")
    sizes = [int(v) for v in batch.grid_values()] if batch is not None else [int(PARAMETERS["batch_size"].default)]
    counts = [int(v) for v in micro.values] if micro is not None and micro.kind == "categorical" else [1]
    for size in sizes:
        for count in counts:
            if size % count == 0 and (size // count) % 2:
                where = f"in {count} micro-batches gives {size // count} rows each" if count > 1 else "is odd"
                raise SearchSpaceError(f"batch_size: {size} {where}; a DPO micro-batch holds whole pairs, two rows "
                                       "each. Use even batch sizes (per micro-batch).",
                                       parameter="batch_size" if batch is not None else "micro_batches",
                                       field="values")


def dpo_spec(values: dict[str, Value], *, objective: str) -> DpoSpec | None:
    """The engine's DPO settings of a trial with hyperparameters `values` (None for objective sft)."""
    if objective != DPO:
        return None
    return DpoSpec(beta=float(values["dpo_beta"]), loss_type=str(values["dpo_loss_type"]))  # type: ignore[arg-type]
