"""A trial's hyperparameters as its page shows them: those its search space gave, then the defaults that applied.

A default applies when the trial trained with it: the engine reads ``dropout`` only for a model built from
scratch (a pretrained checkpoint keeps its own config's), ``momentum`` only for SGD, the LoRA settings only with
a rank above 0, ``lora_r`` itself only on a pretrained model, ``packing`` and ``loss_on`` only on instruction
data (a DPO trial's loss is always on the answers, so it shows no ``loss_on``), and ``dpo_beta`` and
``dpo_loss_type`` only with objective dpo. Width and depth are the model's size, which the experiment names. So
the page lists no value the trial never used, and says which values nobody chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from webapp.experiments.search_space import PARAMETERS, Value
from webapp.ground.models import Experiment, Trial

ALWAYS = ("lr", "batch_size", "weight_decay", "warmup_steps", "lr_decay", "optimizer", "clip_norm", "seq_len",
          "micro_batches", "precision")


@dataclass(frozen=True)
class Setting:
    name: str
    label: str  # what the parameter is, in words
    value: Value
    default: bool  # the trial's space did not name it: the default applied


def applied_defaults(params: dict[str, Value], *, pretrained: bool, instruction: bool, dpo: bool = False) -> list[str]:
    """The parameters a trial of `params` trained with at their defaults (see the module docstring), in the
    order Hydra lists its parameters."""
    def value(name: str) -> Value:
        return params.get(name, PARAMETERS[name].default)

    applies = set(ALWAYS)
    if not pretrained:
        applies.add("dropout")
    if value("optimizer") == "sgd":
        applies.add("momentum")
    if pretrained:
        applies.add("lora_r")
        if int(value("lora_r")) > 0:
            applies.update(("lora_alpha", "lora_dropout", "lora_targets"))
    if instruction:
        applies.update(("packing",) if dpo else ("packing", "loss_on"))
    if dpo:
        applies.update(("dpo_beta", "dpo_loss_type"))
    return [name for name in PARAMETERS if name in applies and name not in params]


def trial_settings(trial: Trial) -> list[Setting]:
    """The trial's parameters as its search space gave them, then the defaults it trained with, labelled."""
    experiment = trial.experiment
    given = [Setting(name, PARAMETERS[name].label if name in PARAMETERS else name, value, default=False)
             for name, value in trial.params.items()]
    defaults = applied_defaults(dict(trial.params), pretrained=experiment.model.get("kind") in ("checkpoint",
                                                                                             "pretrained"),
                                instruction=experiment.dataset.is_instruction,
                                dpo=experiment.objective == Experiment.Objective.DPO)
    return given + [Setting(name, PARAMETERS[name].label, PARAMETERS[name].default, default=True)
                    for name in defaults]
