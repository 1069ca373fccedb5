"""The experiment form: input in, an `ExperimentDraft` out. Its search-space rows, and the initial data a
clone starts from, are `webapp.experiments.space_rows`.

The model is a family preset, a custom size of a family (both trained from scratch on the dataset's tokenizer),
or a ready checkpoint of the catalog (trained on the dataset tokenized with its own tokenizer). A pretrained
directory is accepted only as older experiments stored it (their clones). The form converts and checks what it
can alone (types, ranges, the model, the search space's own rules); `services.experiment_plan` then checks the
draft against the dataset (its token ids, the model's context) and the memory budget.

Instruction and chat data add the ``packing`` and ``loss_on`` parameters (refused on a text corpus, by
planning) and a chat template, which renders the conversations for a pretrained checkpoint instead of its own:
the web worker checks it as the engine will, by rendering a probe conversation under the rendering limits, and
the form waits for that verdict, kept per template text (`webapp.experiments.chat_template`).

The objective (``sft``, or ``dpo`` on a preference dataset: `webapp.experiments.objective`) is a field, or
``objective:`` in pasted text; planning checks it against the dataset, the model and the search space.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from webapp.accounts.models import Team
from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import ready_checkpoints
from webapp.catalog.sizing import host_devices
from webapp.config import MAX_TRIALS
from webapp.datasets.models import Dataset
from webapp.experiments.chat_template import chat_template_verdict, pending_message, template_refusal
from webapp.experiments.model_shapes import (
    BASE_DTYPE_NEEDS_A_CHECKPOINT,
    FAMILY_LABELS,
    PRESETS,
    ModelChoiceError,
    ModelShape,
    model_from_spec,
    model_shape,
)
from webapp.experiments.objective import DPO_PRUNER_METRICS, objective_of
from webapp.experiments.planning import CapError, ExperimentDraft, check_caps, check_steps_budget
from webapp.experiments.pruning import METRIC_LABELS, pruner_spec
from webapp.experiments.search_space import (
    TEMPLATE_KEY,
    SearchSpace,
    SearchSpaceError,
    canonical_name,
    space_from_rows,
)
from webapp.experiments.space_rows import ParameterRowForm, ParameterRowFormSet
from webapp.experiments.space_text import (
    chat_template_of_text,
    checkpoint_minutes_of_text,
    holdout_bytes_of_text,
    load_spec_text,
    max_devices_of_text,
    objective_of_text,
    pruner_of_text,
)
from webapp.ground.models import ChatTemplateCheck, Experiment
from webapp.worker_door import DEFAULT_CHECKPOINT_MINUTES, MAX_CHECKPOINT_MINUTES, MAX_DEVICES_PER_TRIAL

MODEL_KINDS = [("preset", "Preset"), ("custom", "Custom size"), ("checkpoint", "Pretrained checkpoint"),
               ("pretrained", "Pretrained directory (older experiments)")]


class CheckpointField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Checkpoint) -> str:
        millions = f"{obj.n_params / 1e6:.1f}M" if obj.n_params else "?"
        return f"{obj.name} ({FAMILY_LABELS.get(obj.family, obj.family)}, {millions} parameters, " \
               f"context {obj.context_length})"

# A search space (20,000 characters), and a chat template as long as the engine takes (64 Ki characters:
# `worker.engine.chat.MAX_TEMPLATE_CHARS`, which checks it) escaped into JSON (\uXXXX: 6 characters each).
MAX_SPACE_TEXT = 20_000 + 6 * 64 * 1024
MODEL_FIELDS = ("model_kind", "preset", "family", "n_layer", "n_embd", "n_head", "n_kv_head", "n_inner", "n_positions",
                "checkpoint", "pretrained_dir", "base_dtype")


def _check_precision(space: SearchSpace) -> None:
    """Refuse bf16 when this host's workers answered and none has a GPU: bf16 autocast is for GPU devices
    (on a CPU device it would only run slower than fp32). Whether workers are up is not this form's to say:
    with none answering, the choice stands."""
    precision = space.get("precision")
    if precision is None or "bf16" not in precision.grid_values():
        return
    devices = [device.device for device in host_devices()]
    if devices and not any(name.startswith("cuda") for name in devices):
        raise SearchSpaceError(f"precision: bf16 needs a GPU device, and this host's workers have only "
                               f"{', '.join(devices)}; use fp32.", parameter="precision", field="values")


class ExperimentForm(forms.Form):
    name = forms.CharField(max_length=120)
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none())
    model_kind = forms.ChoiceField(choices=MODEL_KINDS, initial="preset", widget=forms.RadioSelect)
    preset = forms.ChoiceField(choices=[(k, label) for k, (label, _) in PRESETS.items()], initial="gpt2-micro",
                               required=False)
    family = forms.ChoiceField(choices=list(FAMILY_LABELS.items()), initial="gpt2", required=False)
    n_layer = forms.IntegerField(min_value=1, max_value=256, initial=4, required=False)
    n_embd = forms.IntegerField(min_value=8, max_value=16_384, initial=128, required=False)
    n_head = forms.IntegerField(min_value=1, max_value=256, initial=4, required=False)
    n_kv_head = forms.IntegerField(min_value=1, max_value=256, required=False, label="Key/value heads",
                                   help_text="Grouped-query attention (not GPT-2); empty: one per head.")
    n_inner = forms.IntegerField(min_value=1, max_value=131_072, required=False, label="MLP width",
                                 help_text="Empty: the family's default (GPT-2 4x width; Llama-style about 8/3x).")
    n_positions = forms.IntegerField(min_value=8, max_value=65_536, initial=256, required=False)
    checkpoint = CheckpointField(queryset=Checkpoint.objects.none(), required=False,
                                 help_text="From the model catalog. Its shape is fixed and the dataset is tokenized "
                                           "with its tokenizer (once per dataset) before its trials start.")
    pretrained_dir = forms.CharField(max_length=500, required=False,
                                     help_text="A save_pretrained GPT-2 directory, relative to the models root.")
    base_dtype = forms.ChoiceField(
        choices=[("fp32", "fp32 (4 bytes a weight)"), ("bf16", "bf16 (2 bytes)"),
                 ("int8", "int8 (1 byte, a scale per row)"),
                 ("nf4", "nf4, QLoRA's 4 bits (about half a byte; embedding and head int8)")],
        initial="fp32", required=False, label="Base precision",
        help_text="LoRA trials on a checkpoint: the precision its frozen weights are kept in, once on the host for "
                  "every trial and on every copy to the device. Each weight is dequantized on the device only "
                  "while its layer computes; the adapters train in fp32. Lower precision takes less memory and "
                  "traffic and changes the base's values a little (nf4 most). Every trial must then be a LoRA "
                  "trial (lora_r above 0).")
    space_text = forms.CharField(
        required=False, max_length=MAX_SPACE_TEXT, widget=forms.Textarea(attrs={"rows": 6}),
        help_text="Optional: paste a search space as YAML or JSON; it replaces the rows above (which are set aside "
                  "while it is there), and a model: entry replaces the model chosen above.",
    )
    objective = forms.ChoiceField(
        choices=Experiment.Objective.choices, initial=Experiment.Objective.SFT, required=False,
        help_text="Language modelling, or DPO on a preference dataset's pairs (from a pretrained checkpoint; searches "
                  "dpo_beta and dpo_loss_type; batch sizes count rows, two a pair).")
    strategy = forms.ChoiceField(choices=Experiment.Strategy.choices, initial=Experiment.Strategy.GRID)
    n_trials = forms.IntegerField(min_value=1, max_value=MAX_TRIALS, initial=8,
                                  help_text="For random search and TPE.")
    budget_unit = forms.ChoiceField(choices=Experiment.BudgetUnit.choices, initial=Experiment.BudgetUnit.STEPS)
    budget = forms.FloatField(min_value=0.01, initial=200)  # its cap is the steps cap (`check_steps_budget`)
    eval_every = forms.IntegerField(min_value=1, max_value=1_000_000, initial=20,
                                    help_text="Evaluate every this many steps.")
    seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0)
    memory_budget = forms.ChoiceField(choices=[("auto", "Auto (from the device)"), ("explicit", "Explicit")],
                                      initial="auto", widget=forms.RadioSelect)
    memory_budget_mib = forms.IntegerField(min_value=1, max_value=16 * 1024 * 1024, required=False,
                                           label="Memory budget (MiB)")
    early_stop_patience = forms.IntegerField(
        min_value=1, max_value=10_000, required=False,
        help_text="Optional: stop a trial after this many evaluations without a better validation loss.",
    )
    checkpoint_minutes = forms.IntegerField(
        min_value=0, max_value=int(MAX_CHECKPOINT_MINUTES), initial=int(DEFAULT_CHECKPOINT_MINUTES), required=False,
        label="Checkpoint every (minutes)",
        help_text="Copy each trial's training state to disk this often and when it ends, so a host restart "
                  "costs at most this much of its work; 0 turns checkpoints off (empty: 30).",
    )

    max_devices_per_trial = forms.IntegerField(
        min_value=1, max_value=MAX_DEVICES_PER_TRIAL, required=False, label="Devices per trial at most",
        help_text="When devices would otherwise idle (the last trials of a sweep, a lone fine-tune), a trial runs "
                  "the micro-batches of a step on several devices at once, with the same numbers as on one: more "
                  "micro_batches let it spread wider. Empty: as many devices as it has micro-batches.",
    )

    pruner = forms.ChoiceField(
        choices=[("none", "None: every trial trains its whole budget"),
                 ("asha", "ASHA (asynchronous successive halving)"), ("hyperband", "Hyperband"),
                 ("median", "Median rule")],
        initial="none", required=False,
        help_text="Stops trials that fall behind at their evaluations; the devices they free go to the others.")
    pruner_metric = forms.ChoiceField(
        choices=list(METRIC_LABELS.items()), initial="loss", required=False, label="Compare trials by",
        help_text="The evaluation figure the pruner ranks trials by; preference accuracy and reward margin are DPO "
                  "experiments' only.")
    pruner_min_resource = forms.IntegerField(
        min_value=1, max_value=10_000_000, required=False, label="First rung (steps)",
        help_text="ASHA and Hyperband: the step of the first rung (empty: the evaluation interval).")
    pruner_reduction_factor = forms.IntegerField(
        min_value=2, max_value=100, initial=3, required=False, label="Reduction factor",
        help_text="Each rung is this many times further, and the best 1/factor of the trials there go on.")
    pruner_min_early_stopping_rate = forms.IntegerField(
        min_value=0, max_value=20, initial=0, required=False, label="Minimum early-stopping rate",
        help_text="ASHA: skip this many rungs before the first (brackets, in Hyperband's terms).")
    pruner_n_startup_trials = forms.IntegerField(
        min_value=0, max_value=10_000, initial=5, required=False, label="Finished trials before pruning",
        help_text="Median rule: prune nothing until this many trials finished.")
    pruner_n_warmup_steps = forms.IntegerField(
        min_value=0, max_value=10_000_000, initial=0, required=False, label="Warm-up steps",
        help_text="Median rule: a trial is not pruned before this step.")

    holdout_bytes = forms.IntegerField(
        min_value=1, max_value=10**12, required=False, label="Final evaluation on (bytes)",
        help_text="Every trial ends with an evaluation on the dataset's validation text: all of it (empty), or "
                  "its first this many bytes. Trials of a dataset rank on the leaderboards by the same text.")

    chat_template = forms.CharField(
        required=False, strip=False, widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        label="Chat template",
        help_text="Optional, for instruction and chat data on a pretrained checkpoint: a Jinja chat template (as in "
                  "a tokenizer_config.json) that renders the conversations instead of the checkpoint's own (or "
                  "ChatML when it has none). It is checked on a sample conversation: it must render, and render "
                  "each earlier turn the same once later turns follow, so that the assistant's tokens can be "
                  "found. The exported model's tokenizer carries it. A model trained from scratch uses the "
                  "dataset's ChatML rendering.")

    priority = forms.ChoiceField(
        choices=Experiment.Priority.choices, initial=Experiment.Priority.NORMAL, required=False,
        help_text="Orders your team's trials on the devices (high first); other teams keep their share.")

    def __init__(self, *args: Any, team: Team, rows: ParameterRowFormSet, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.team = team
        self.rows = rows
        self.fields["dataset"].queryset = Dataset.objects.filter(team=team, status=Dataset.Status.READY)
        self.fields["checkpoint"].queryset = ready_checkpoints()
        caps = settings.HYDRA.caps
        self.fields["n_trials"].help_text = (f"For random search and TPE; at most {caps.trials_per_experiment} "
                                             "trials per experiment.")
        self.fields["budget"].help_text = (f"Training length of each trial: at most {caps.steps_per_trial:,} "
                                           f"optimizer steps and {caps.tokens_per_trial:,} tokens.")

    def is_valid(self) -> bool:
        """Valid when the form and every row are; `clean` may add errors to rows, so rows are judged after.
        Pasted text replaces the rows: then only the form counts."""
        form_valid = super().is_valid()
        if self.pasted_text():
            return form_valid
        rows_valid = self.rows.is_valid() and not self.rows.non_form_errors()
        return form_valid and rows_valid

    def pasted_text(self) -> bool:
        """Whether a search space was pasted (it replaces the rows)."""
        return bool(str(self.data.get("space_text") or "").strip()) if self.is_bound else False

    def _model(self, cleaned: dict[str, Any]) -> dict[str, Any] | None:
        """The stored model choice, or None after adding field errors for a custom size's missing fields."""
        kind = cleaned.get("model_kind")
        if kind in ("preset", "custom") and (cleaned.get("base_dtype") or "fp32") != "fp32":
            self.add_error("base_dtype", BASE_DTYPE_NEEDS_A_CHECKPOINT)
            return None
        if kind == "preset":
            return {"kind": "preset", "preset": cleaned.get("preset") or "gpt2-micro"}
        if kind == "custom":
            missing = [f for f in ("n_layer", "n_embd", "n_head", "n_positions") if cleaned.get(f) is None]
            for name in missing:
                self.add_error(name, "Required for a custom size.")
            if missing:
                return None
            sizes = {f: cleaned[f] for f in ("n_layer", "n_embd", "n_head", "n_positions")}
            optional = {f: cleaned[f] for f in ("n_kv_head", "n_inner") if cleaned.get(f) is not None}
            return {"kind": "custom", "family": cleaned.get("family") or "gpt2", **sizes, **optional}
        if kind == "checkpoint":
            checkpoint = cleaned.get("checkpoint")
            if checkpoint is None:
                if "checkpoint" not in self.errors:
                    self.add_error("checkpoint", "Choose a checkpoint of the catalog.")
                return None
            return {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name,
                    **self._base_dtype(cleaned)}
        return {"kind": "pretrained", "pretrained_dir": (cleaned.get("pretrained_dir") or "").strip(),
                **self._base_dtype(cleaned)}

    @staticmethod
    def _base_dtype(cleaned: dict[str, Any]) -> dict[str, Any]:
        """The model's ``base_dtype`` entry: none for fp32, so that a choice stays as it was before the field."""
        base_dtype = cleaned.get("base_dtype") or "fp32"
        return {} if base_dtype == "fp32" else {"base_dtype": base_dtype}

    def _checkpoint_minutes(self, cleaned: dict[str, Any]) -> int:
        """The pasted text's ``checkpoint_minutes``, else the field's, else the default (30)."""
        for value in (self.pasted_checkpoint_minutes, cleaned.get("checkpoint_minutes")):
            if value is not None:
                return value
        return 30

    def _max_devices(self, cleaned: dict[str, Any]) -> int | None:
        """The pasted text's ``max_devices_per_trial`` when it sets one, else the field's (None: no cap)."""
        text = (cleaned.get("space_text") or "").strip()
        if text:
            try:
                named, value = max_devices_of_text(text)
            except SearchSpaceError as error:
                self.add_error("space_text", str(error))
                return None
            if named:
                return value
        return cleaned.get("max_devices_per_trial")

    def _pruner(self, cleaned: dict[str, Any]) -> dict[str, Any] | None:
        """The pasted text's ``pruner``, else the fields' (None: no pruning); adds a field error when invalid."""
        text = (cleaned.get("space_text") or "").strip()
        try:
            if text:
                named, raw = pruner_of_text(text)
                if named:
                    return pruner_spec(raw)
            kind = cleaned.get("pruner") or "none"
            if kind == "none":
                return None
            fields = {"kind": kind, "metric": cleaned.get("pruner_metric") or "loss",
                      "min_resource": cleaned.get("pruner_min_resource") or cleaned.get("eval_every") or 1,
                      "reduction_factor": cleaned.get("pruner_reduction_factor") or 3}
            if kind == "asha":
                fields["min_early_stopping_rate"] = cleaned.get("pruner_min_early_stopping_rate") or 0
            if kind == "median":
                fields["n_startup_trials"] = cleaned.get("pruner_n_startup_trials")
                fields["n_warmup_steps"] = cleaned.get("pruner_n_warmup_steps") or 0
                if fields["n_startup_trials"] is None:
                    fields["n_startup_trials"] = 5
            return pruner_spec(fields, field="pruner")
        except SearchSpaceError as error:
            self.add_error(error.field if error.field in self.fields else "space_text", str(error))
            return None

    def _model_error_field(self, field: str) -> str | None:
        """Where a model's error shows: its field, or the pasted text when that named the model."""
        if getattr(self, "pasted_model", None) is not None and field in MODEL_FIELDS:
            return "space_text"
        return field if field in self.fields else None

    def _space(self, cleaned: dict[str, Any]) -> SearchSpace:
        """The search space of the pasted text, or else of the rows. A ``model`` entry in the pasted text is kept
        as ``pasted_model`` (see `model_shapes.model_from_spec`)."""
        text = (cleaned.get("space_text") or "").strip()
        if text:
            self.pasted_model, space = load_spec_text(text)
            self.pasted_checkpoint_minutes = checkpoint_minutes_of_text(text)
            return space
        if not self.rows.is_valid():
            raise SearchSpaceError("", field="rows")
        rows = [row.cleaned_data for row in self.rows.forms if row.cleaned_data and not row.cleaned_data.get("DELETE")]
        return space_from_rows(rows)

    def clean(self) -> dict[str, Any]:
        """Adds ``draft`` (an `ExperimentDraft`) when every field converts."""
        cleaned = super().clean()
        model = shape = space = None
        self.pasted_model: object | None = None
        self.template_check: ChatTemplateCheck | None = None
        self.pasted_checkpoint_minutes: int | None = None
        try:
            space = self._space(cleaned)
            _check_precision(space)
        except SearchSpaceError as error:
            self._add_space_error(error, from_text=bool((cleaned.get("space_text") or "").strip()))
        try:
            model = model_from_spec(self.pasted_model) if self.pasted_model is not None else self._model(cleaned)
            shape = model_shape(model, models_root=settings.HYDRA.models_root) if model else None
        except ModelChoiceError as error:
            self.add_error(self._model_error_field(error.field), str(error))
        budget = None
        if cleaned.get("memory_budget") == "explicit":
            if cleaned.get("memory_budget_mib") is None:
                self.add_error("memory_budget_mib", "Give the budget in MiB, or choose auto.")
            else:
                budget = cleaned["memory_budget_mib"] * 1024 * 1024
        if cleaned.get("budget_unit") == Experiment.BudgetUnit.STEPS and cleaned.get("budget") is not None:
            try:
                check_steps_budget(budget=cleaned["budget"], caps=settings.HYDRA.caps)
            except CapError as error:
                self.add_error(error.field, str(error))
        pruner = self._pruner(cleaned)
        holdout = cleaned.get("holdout_bytes")
        holdout_field = "holdout_bytes"
        if (cleaned.get("space_text") or "").strip():
            try:
                pasted_holdout = holdout_bytes_of_text(cleaned["space_text"])
            except SearchSpaceError as error:
                self.add_error("space_text", str(error))
            else:
                if pasted_holdout is not None:
                    holdout, holdout_field = pasted_holdout, "space_text"
        dataset = cleaned.get("dataset")
        if holdout is not None and dataset is not None and dataset.is_instruction:
            self.add_error(holdout_field, "holdout_bytes applies to text corpora: on instruction and chat data the "
                                          "final evaluation covers every validation example that fits max_seq_len. "
                                          "Leave it empty.")
        template = self._chat_template(cleaned, shape=shape)
        max_devices = self._max_devices(cleaned)
        objective = self._objective(cleaned, pruner)
        if not self.errors and model is not None and shape is not None and space is not None:
            draft = ExperimentDraft(
                name=cleaned["name"].strip(), dataset=cleaned["dataset"], model=model, shape=shape, space=space,
                strategy=cleaned["strategy"], n_trials=cleaned["n_trials"], budget_unit=cleaned["budget_unit"],
                budget=cleaned["budget"], eval_every=cleaned["eval_every"], seed=cleaned["seed"],
                memory_budget_bytes=budget, early_stop_patience=cleaned.get("early_stop_patience"),
                checkpoint_minutes=self._checkpoint_minutes(cleaned),
                priority=cleaned.get("priority") or Experiment.Priority.NORMAL, pruner=pruner,
                holdout_bytes=holdout, chat_template=template, max_devices_per_trial=max_devices,
                objective=objective,
            )
            try:
                check_caps(draft, caps=settings.HYDRA.caps)
            except CapError as error:
                self.add_error(error.field, str(error))
            except SearchSpaceError as error:  # a range a grid cannot expand
                self._add_space_error(error, from_text=bool((cleaned.get("space_text") or "").strip()))
            else:
                cleaned["draft"] = draft
        return cleaned

    def _objective(self, cleaned: dict[str, Any], pruner: dict[str, Any] | None) -> str:
        """The pasted text's ``objective``, else the field's (sft by default); adds an error where it came from
        when it names none, and on the pruner's metric when that is a DPO figure and the objective is not."""
        text = (cleaned.get("space_text") or "").strip()
        field, objective = "objective", "sft"
        try:
            pasted = objective_of_text(text) if text else None
            if pasted is not None:
                field = "space_text"
            objective = objective_of(pasted if pasted is not None else cleaned.get("objective"), field=field)
        except SearchSpaceError as error:
            self.add_error(field, str(error))
        metric = (pruner or {}).get("metric", "loss")
        if objective != "dpo" and metric in DPO_PRUNER_METRICS:
            self.add_error("space_text" if text and pruner_of_text(text)[0] else "pruner_metric",
                           f"The pruner's metric {metric} is a DPO trial's figure; with objective {objective}, "
                           "compare trials by loss or bpb.")
        return objective

    def _chat_template(self, cleaned: dict[str, Any], *, shape: ModelShape | None) -> str:
        """The pasted text's ``chat_template``, else the field's ("" for none), with the line ends a browser's
        textarea sends made Unix ones; adds an error where it came from when it cannot render the dataset for
        the model, or while the web worker checks it (see `chat_template.template_refusal`,
        `chat_template.chat_template_verdict`; ``template_check`` is then the check, for the page)."""
        text = (cleaned.get("space_text") or "").strip()
        template, field = cleaned.get("chat_template") or "", "chat_template"
        if text:
            try:
                pasted = chat_template_of_text(text)
            except SearchSpaceError as error:
                self.add_error("space_text", str(error))
                return ""
            if pasted is not None:
                template, field = pasted, "space_text"
        template = template.replace("\r\n", "\n")
        if not template.strip():
            return ""
        dataset = cleaned.get("dataset")
        if dataset is None or shape is None:
            return template  # the dataset's or the model's own error says what to fix first
        message = template_refusal(dataset=dataset, shape=shape, chat_template=template)
        if message is None:
            self.template_check = chat_template_verdict(template)
            if self.template_check.status == ChatTemplateCheck.Status.REFUSED:
                message = self.template_check.message
            elif self.template_check.status != ChatTemplateCheck.Status.OK:
                message = pending_message()
        if message is not None:
            self.add_error(field, f"{TEMPLATE_KEY}: {message}" if field == "space_text"
                           else message[:1].upper() + message[1:])
        return template

    def _add_space_error(self, error: SearchSpaceError, *, from_text: bool) -> None:
        """Put each of a search-space error's errors where the user will look: the pasted text, the row, or the
        strategy."""
        for each in error.errors:
            self._add_one_space_error(each, from_text=from_text)

    def _add_one_space_error(self, error: SearchSpaceError, *, from_text: bool) -> None:
        message = str(error)
        if not message:
            return  # the rows already carry their own field errors
        if error.field in ("strategy", "n_trials"):
            self.add_error(error.field, message)
        elif from_text or error.field == "space_text":
            self.add_error("space_text", message)
        elif error.parameter is None:
            # Django offers no setter for the formset's own errors.
            self.rows._non_form_errors = self.rows.error_class([*self.rows.non_form_errors(), message])
        else:
            row = self.row_for(error.parameter)
            field = error.field if error.field in ParameterRowForm.base_fields else None
            if row is None:
                self.add_error(None, message)
            else:
                row.add_error(field, message)

    def row_for(self, parameter: str) -> ParameterRowForm | None:
        for row in self.rows.forms:
            if getattr(row, "cleaned_data", None) and canonical_name(row.cleaned_data.get("name", "")) == \
                    canonical_name(parameter):
                return row
        return None

    def add_draft_error(self, error: Exception) -> None:
        """Place an error raised while planning a valid draft (see `services.experiment_plan`)."""
        if isinstance(error, SearchSpaceError):
            self._add_space_error(error, from_text=bool((self.cleaned_data.get("space_text") or "").strip()))
        elif isinstance(error, ModelChoiceError):
            self.add_error(self._model_error_field(error.field), str(error))
        elif isinstance(error, CapError):
            self.add_error(error.field if error.field in self.fields else None, str(error))
        else:
            self.add_error("memory_budget_mib" if self.cleaned_data.get("memory_budget") == "explicit" else None,
                           str(error))
