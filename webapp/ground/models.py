"""Experiments (a dataset, a model, a search space, a strategy, a budget) and their trials.

Per-step metrics, evaluation results, unit spans and device samples are telemetry: they live in their own
app (``webapp.telemetry``), keyed by trial id, not here. A trial keeps only
the summary the pages list (status, progress, ETA, best validation result) and its memory plan.

A trial's statuses are the scheduler's states (`worker.contract.TrialState`, through `webapp.worker_door`)
plus "new"; the checkpoint interval's default and ceiling are the contract's too.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from webapp.background.models import WebWork
from webapp.worker_door import DEFAULT_CHECKPOINT_MINUTES, MAX_CHECKPOINT_MINUTES, MAX_DEVICES_PER_TRIAL, TrialState
from webapp.worker_door import ENDED as CONTRACT_ENDED


class Experiment(models.Model):
    class Strategy(models.TextChoices):
        GRID = "grid", "Grid (every combination)"
        RANDOM = "random", "Random search"
        TPE = "tpe", "TPE (Bayesian, Optuna)"

    class Objective(models.TextChoices):
        """What the trials minimize: the language-modelling loss on the dataset's text or examples, or DPO's loss
        on its preference pairs (`webapp.experiments.objective`)."""

        SFT = "sft", "Language modelling (SFT)"
        DPO = "dpo", "Preference tuning (DPO)"

    class BudgetUnit(models.TextChoices):
        STEPS = "steps", "optimizer steps"
        EPOCHS = "epochs", "epochs over the training split"

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=120)
    dataset = models.ForeignKey("datasets.Dataset", on_delete=models.PROTECT, related_name="experiments")
    model = models.JSONField(help_text='{"kind": "preset"|"custom"|"pretrained", ...}: see ExperimentForm.')
    search_space = models.JSONField(help_text="Serialized search space: {name: {kind, values | low, high, step}}.")
    objective = models.CharField(
        max_length=4, choices=Objective.choices, default=Objective.SFT,
        help_text="sft: the language-modelling loss; dpo: DPO on a preference dataset, from a pretrained checkpoint.")
    strategy = models.CharField(max_length=10, choices=Strategy.choices)
    n_trials = models.PositiveIntegerField(help_text="Trials for random search and TPE (a grid has its own count).")
    budget_unit = models.CharField(max_length=10, choices=BudgetUnit.choices, default=BudgetUnit.STEPS)
    budget = models.FloatField(help_text="Training length per trial, in budget_unit.")
    eval_every = models.PositiveIntegerField(help_text="Evaluate on the validation split every this many steps.")
    seed = models.BigIntegerField(default=0)
    memory_budget_bytes = models.BigIntegerField(null=True, blank=True, help_text="Device budget; null = auto.")
    early_stop_patience = models.PositiveIntegerField(
        null=True, blank=True, help_text="Stop a trial after this many evaluations without improvement."
    )
    checkpoint_minutes = models.PositiveIntegerField(
        default=int(DEFAULT_CHECKPOINT_MINUTES), validators=[MaxValueValidator(int(MAX_CHECKPOINT_MINUTES))],
        help_text="Copy each trial's training state to disk every this many minutes and when it ends (0: never).",
    )
    max_devices_per_trial = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_DEVICES_PER_TRIAL)],
        help_text="The most devices one trial's micro-batches run on at once when devices would idle (null: all).",
    )

    class Priority(models.TextChoices):
        LOW = "low", "Low"
        NORMAL = "normal", "Normal"
        HIGH = "high", "High"

    priority = models.CharField(
        max_length=8, choices=Priority.choices, default=Priority.NORMAL,
        help_text="Orders this team's trials on the devices (high first); other teams' shares are not affected.")
    pruner = models.JSONField(
        null=True, blank=True,
        help_text='Stops trials that fall behind at their evaluations: {"kind": "asha"|"hyperband"|"median", ...} '
                  "(see webapp.experiments.pruning); null: trials run their whole budget.")
    holdout_bytes = models.BigIntegerField(
        null=True, blank=True,
        help_text="The final evaluation of every trial covers this many bytes of the dataset's validation text; "
                  "null: all of it.")
    chat_template = models.TextField(
        blank=True,
        help_text="Instruction and chat data on a pretrained checkpoint: the Jinja chat template its conversations "
                  "are rendered with; blank: the checkpoint's own, else ChatML.")
    tags = models.JSONField(default=list, blank=True, help_text="Short labels the team searches and filters by.")
    notes = models.TextField(blank=True, help_text="Free text: what the experiment is for, what was learnt.")
    cloned_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    launched = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]
        # The experiment list reads a team's experiments newest first, a page at a time.
        indexes = [models.Index(fields=["team", "-created", "-id"], name="experiment_team_newest")]

    def __str__(self) -> str:
        return self.name


class Trial(models.Model):
    class Status(models.TextChoices):
        """The scheduler's states, as the pages name them, and "new": a trial not launched yet."""

        NEW = "new", "Not launched"
        PLANNING = TrialState.PLANNING.value, "Planning"
        RUNNABLE = TrialState.RUNNABLE.value, "Queued"
        RUNNING = TrialState.RUNNING.value, "Running"
        PAUSED = TrialState.PAUSED.value, "Paused"
        FINISHED = TrialState.FINISHED.value, "Finished"
        FAILED = TrialState.FAILED.value, "Failed"
        CANCELLED = TrialState.CANCELLED.value, "Cancelled"
        PRUNED = TrialState.PRUNED.value, "Pruned"

    ENDED = tuple(map(Status, [state for state in TrialState if state in CONTRACT_ENDED]))
    ACTIVE = tuple(map(Status, [state for state in TrialState if state not in CONTRACT_ENDED]))

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the experiment.")
    params = models.JSONField(help_text="The searched hyperparameters' values.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.NEW, db_index=True)
    attempt = models.PositiveIntegerField(default=0, help_text="Launches so far (retries add one).")
    queue_id = models.CharField(
        max_length=40, blank=True, db_index=True,
        help_text="The id the scheduler knows this attempt by: '<pk>' at first, '<pk>.<attempt>' after a retry.",
    )
    host = models.CharField(
        max_length=63, blank=True,
        help_text="The host whose queue runs this attempt, chosen when it is first sent; empty: this web app's own.")
    submitted = models.BooleanField(
        default=False,
        help_text="Whether the scheduler holds this attempt; a launched one not yet submitted waits in this outbox.",
    )
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField()
    remaining_s = models.FloatField(null=True, blank=True, help_text="The scheduler's remaining-time estimate.")
    best_val_loss = models.FloatField(null=True, blank=True)
    best_val_ppl = models.FloatField(null=True, blank=True)
    rung = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The pruner's last rung the trial reached (where it stopped, if pruned).")
    final_bpb = models.FloatField(
        null=True, blank=True, db_index=True,
        help_text="Validation bits per byte of the final evaluation, on the experiment's declared held-out text.")
    final_loss = models.FloatField(null=True, blank=True, help_text="Its loss per token (nats).")
    final_ppl = models.FloatField(null=True, blank=True, help_text="Its perplexity per token.")
    final_reward_accuracy = models.FloatField(
        null=True, blank=True, help_text="DPO: the final evaluation's preference accuracy (share of held-out pairs "
                                         "whose chosen answer has the higher implicit reward).")
    final_reward_margin = models.FloatField(
        null=True, blank=True, help_text="DPO: its mean reward margin (chosen less rejected implicit reward).")
    final_step = models.PositiveIntegerField(null=True, blank=True, help_text="Steps trained at the final evaluation.")
    final_eval_bytes = models.BigIntegerField(
        null=True, blank=True, help_text="UTF-8 bytes of the validation text the final evaluation's tokens cover.")
    continued = models.JSONField(
        default=list, blank=True,
        help_text="Segments of steps added after the trial ended: [{steps, lr, warmup_steps, decay, at}].")
    tags = models.JSONField(default=list, blank=True, help_text="Short labels the team searches and filters by.")
    notes = models.TextField(blank=True, help_text="Free text about this trial.")
    message = models.TextField(blank=True, help_text="Why the trial failed, for the UI.")
    plan = models.JSONField(null=True, blank=True, help_text="Memory plan: an estimate, then the measured one.")
    spec = models.JSONField(null=True, blank=True, help_text="The engine TrialSpec (as a dict) sent at launch.")
    export_path = models.CharField(max_length=500, blank=True, help_text="The final model directory, once exported.")
    checkpoint_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="Steps done in the attempt's last durable checkpoint (workers report it).")
    checkpoint_at = models.DateTimeField(null=True, blank=True, help_text="When that checkpoint's state was taken.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["experiment", "number"]
        constraints = [models.UniqueConstraint(fields=["experiment", "number"], name="unique_trial_number")]
        # Leaderboards rank trials by either metric, ties to the earlier finish; the experiment list asks
        # whether an experiment has a trial in a status (its derived status) and counts them by status.
        indexes = [models.Index(fields=["best_val_ppl", "finished"]),
                   models.Index(fields=["best_val_loss", "finished"], name="trial_best_val_loss"),
                   models.Index(fields=["experiment", "status"], name="trial_experiment_status")]

    def __str__(self) -> str:
        return f"{self.experiment.name} #{self.number}"

    def attempt_queue_id(self, attempt: int) -> str:
        return str(self.pk) if attempt <= 1 else f"{self.pk}.{attempt}"

    def queue_ids(self) -> list[str]:
        """Every id the scheduler knew this trial by: one per attempt, and one per continuation sent
        (`webapp.experiments.continuing`); each may have left a spill store, checkpoints and an archive."""
        ids = [self.attempt_queue_id(n) for n in range(1, self.attempt + 1)]
        return ids + [c["queue_id"] for c in self.continued if c.get("queue_id") and c["queue_id"] not in ids]

    @property
    def added_steps(self) -> int:
        """Steps added by continuing the trial after it ended (a continuation sent again counts once)."""
        return sum(steps for _, steps in {(c["after"], c["steps"]) for c in self.continued})

    @property
    def queue_host(self) -> str:
        """The host whose queue holds this attempt (this web app's own host until one is chosen)."""
        return self.host or settings.HYDRA.worker.host_id

    def host_bytes(self) -> int:
        """The most the trial's spill store takes on the host tier, from its memory plan, while its micro-batches
        run one at a time: its parameters and their gradients, optimizer state and one micro-batch's boundary
        activations, and one shard's state again, for the new versions a unit writes before its commit lets the
        old ones go; and a LoRA trial's shared base, at the precision it is kept in (0 without a plan, which
        admission counts as nothing). The first LoRA trial on a host builds the base; admission cannot tell which
        trials will find it built, so each counts it, an upper bound that a low-bit base makes smaller."""
        plan = self.plan or {}
        spilled = plan.get("spilled_bytes")
        if not isinstance(spilled, dict):
            return 0
        in_flight = max((int(s.get("state_bytes", 0)) for s in plan.get("shards", [])), default=0)
        base = int(plan.get("base_bytes") or 0)
        return int(sum(spilled.values()) + spilled.get("parameters", 0) + in_flight + base)

    def lane_bytes(self) -> int:
        """What the trial's spill store takes more for each micro-batch beyond the first that runs at once (on
        another device), from its memory plan (0 without one): its boundary activations and their gradients; for a
        model of one shard, whose micro-batches but a step's first may each park a gradient until the ones ahead of
        them are summed, that many gradients (an upper bound at any width)."""
        plan = self.plan or {}
        spilled = plan.get("spilled_bytes")
        if not isinstance(spilled, dict):
            return 0
        spec = self.spec or {}
        if len(plan.get("shards") or ()) == 1:
            return max(0, int(spec.get("micro_batches", 1)) - 1) * int(spilled.get("parameters", 0))
        return int(spilled.get("boundary_activations", 0))

    @property
    def spill_dirs(self) -> list[Path]:
        """The spill stores of every attempt (the scheduler keeps one per queue id)."""
        return [settings.HYDRA.worker.spill_dir / queue_id for queue_id in self.queue_ids()]

    @property
    def archive_dirs(self) -> list[Path]:
        """Where the model downloads of every attempt are packed (`TrialArchive`)."""
        return [archive_dir_for(queue_id) for queue_id in self.queue_ids()]

    @property
    def checkpoint_dirs(self) -> list[Path]:
        """The durable checkpoints of every attempt (`worker.engine.durable`, written by the workers)."""
        return [settings.HYDRA.data_dir / "checkpoints" / queue_id for queue_id in self.queue_ids()]

    def export_dir_for(self, queue_id: str) -> Path:
        """Where the worker writes this attempt's final model (``save_pretrained``)."""
        return settings.HYDRA.data_dir / "exports" / queue_id

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def progress(self) -> float:
        return self.step / self.total_steps if self.total_steps else 0.0


class TrialArchive(WebWork):
    """A finished trial's model, or its LoRA adapter alone, packed as a .tar.gz for download by the web worker on
    request (`webapp.experiments.archives`), with the bytes packed so far while it is preparing.

    It belongs to one attempt (``queue_id``): a retried trial's new model needs a new archive.
    """

    class Status(models.TextChoices):
        PREPARING = "preparing", "Preparing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    class Kind(models.TextChoices):
        MODEL = "model", "Model (a LoRA trial's merged model)"
        ADAPTER = "adapter", "LoRA adapter alone"

    PENDING = Status.PREPARING
    RETRY_HINT = "Prepare the download again to retry."
    TASK: ClassVar[str] = "hydra.web.trial_archive_build"

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="archives")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.MODEL)
    queue_id = models.CharField(max_length=40, help_text="The attempt whose exported model this packs.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PREPARING)
    message = models.TextField(blank=True, help_text="Why packing failed, for the UI.")
    size_bytes = models.BigIntegerField(null=True, blank=True, help_text="The archive's size, once ready.")
    total_bytes = models.BigIntegerField(null=True, blank=True, help_text="The bytes of the files it packs.")
    packed_bytes = models.BigIntegerField(default=0, help_text="Of those, the bytes packed so far.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trial", "kind"], name="unique_trial_archive_kind")]

    def __str__(self) -> str:
        return f"{self.kind} archive of {self.trial}"

    @property
    def directory(self) -> Path:
        """Where the archive is written: ``<HYDRA_DATA_DIR>/archives/<queue_id>/``."""
        return archive_dir_for(self.queue_id)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.kind}.tar.gz"

    @property
    def percent(self) -> int:
        """How much of it is packed, in percent (0 until the web worker starts)."""
        return min(100, 100 * self.packed_bytes // self.total_bytes) if self.total_bytes else 0


class ExperimentPreview(WebWork):
    """The trials and memory plans a draft starts with, planned by the web worker for a draft too large to
    plan in a request (`webapp.experiments.previews`): one per team and draft key."""

    class Status(models.TextChoices):
        PREPARING = "preparing", "Preparing…"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    PENDING = Status.PREPARING
    RETRY_HINT = "Preview again to retry."
    TASK: ClassVar[str] = "hydra.web.experiment_preview_plan"

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64, help_text="A hash of what planning the draft depends on (`preview_key`).")
    dataset = models.ForeignKey("datasets.Dataset", on_delete=models.CASCADE, related_name="+")
    draft = models.JSONField(help_text="The draft, as `ExperimentDraft.to_dict` writes it.")
    budget_bytes = models.BigIntegerField(help_text="The device budget the trials are planned for.")
    budget_note = models.CharField(max_length=200, help_text="Where the budget came from.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PREPARING)
    trials = models.JSONField(null=True, blank=True, help_text="Once ready: [{number, params, total_steps, plan}].")
    message = models.TextField(blank=True, help_text="Why planning failed, for the UI.")
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "key"], name="unique_preview_key")]

    def __str__(self) -> str:
        return f"preview {self.key[:12]} of team {self.team_id}"


class ChatTemplateCheck(WebWork):
    """Whether a chat template renders conversations as the engine needs, checked once per template text by the
    web worker (`webapp.experiments.chat_template`), under the rendering limits: its verdict is kept by the
    text's SHA-256, whoever asks next."""

    class Status(models.TextChoices):
        CHECKING = "checking", "Checking…"
        OK = "ok", "Passed"
        REFUSED = "refused", "Refused"
        FAILED = "failed", "Not checked"  # the work was not done (given up, or an error of ours): asked again

    PENDING = Status.CHECKING
    RETRY_HINT = "Submit the form again to check it anew."
    TASK: ClassVar[str] = "hydra.web.chat_template_check"

    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the template's text, in hex.")
    template = models.TextField(blank=True, help_text="The text, until it is checked.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.CHECKING)
    message = models.TextField(blank=True, help_text="Why it was refused, or not checked, for the form.")
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    checked = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"chat template {self.digest[:12]}: {self.status}"


def archive_dir_for(queue_id: str) -> Path:
    return settings.HYDRA.data_dir / "archives" / queue_id


class Generation(WebWork):
    """A continuation of a prompt by a finished trial's exported model, generated by the web worker on request
    (`webapp.experiments.generations`), with the sampling settings it used. It belongs to one attempt
    (``queue_id``): a retried trial's earlier generations stay listed, made by the model of their attempt.

    A held-out answer (``held_out_line`` set) is asked for by the app itself when a chat trial finishes: the
    model answers a validation example's conversation (``messages``), shown beside the example's own answer
    (``reference``). Each attempt has at most one per example (the unique constraint), however often its
    finished event is applied."""

    class Status(models.TextChoices):
        PENDING = "pending", "Generating…"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    PENDING = Status.PENDING
    RETRY_HINT = "Generate again to retry."
    TASK: ClassVar[str] = "hydra.web.trial_generate"
    PROMPT_MAX_CHARS = 4000
    MAX_NEW_TOKENS = 256
    MAX_TEMPERATURE = 2.0
    MAX_SEED = 2**31 - 1

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="generations")
    queue_id = models.CharField(max_length=40, help_text="The attempt whose exported model generates.")
    prompt = models.TextField(help_text=f"The text to continue, at most {PROMPT_MAX_CHARS} characters.")
    max_new_tokens = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_NEW_TOKENS)], help_text="Tokens to generate, at most.")
    temperature = models.FloatField(
        validators=[MinValueValidator(0.0), MaxValueValidator(MAX_TEMPERATURE)],
        help_text="Sampling temperature; 0 takes the most likely token every time (greedy).")
    top_p = models.FloatField(
        validators=[MinValueValidator(0.01), MaxValueValidator(1.0)],
        help_text="Nucleus sampling: draw from the smallest set of tokens this likely together.")
    seed = models.PositiveIntegerField(validators=[MaxValueValidator(MAX_SEED)],
                                       help_text="The sampling's random seed: equal settings give equal text.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    text = models.TextField(blank=True, help_text="The generated continuation (without the prompt).")
    message = models.TextField(blank=True, help_text="Why generating failed, for the UI.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)
    messages = models.JSONField(
        null=True, blank=True,
        help_text="A conversation to answer ([{role, content}], rendered with the model's chat template); null: "
                  "the prompt alone.")
    reference = models.TextField(blank=True, help_text="A held-out answer: the example's own last answer.")
    held_out_line = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="A held-out answer: the validation example's line in the dataset's file; null: asked for by a user.")

    class Meta:
        ordering = ["-created", "-pk"]
        constraints = [models.UniqueConstraint(fields=["trial", "queue_id", "held_out_line"],
                                               name="unique_held_out_answer_per_attempt")]

    def __str__(self) -> str:
        return f"generation {self.pk} of {self.trial}"

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


class SavedComparison(models.Model):
    """A named set of the team's experiments whose learning curves are compared together, with the curves
    page's settings (axis, metric, smoothing, log scale) it was saved with. Deleting an experiment takes it
    out of the comparisons that named it; they open with the others."""

    NAME_MAX_CHARS = 120

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="saved_comparisons")
    name = models.CharField(max_length=NAME_MAX_CHARS)
    experiments = models.ManyToManyField(Experiment, related_name="saved_comparisons")
    view = models.JSONField(default=dict, blank=True,
                            help_text="The curves page's settings: {x, metric, smooth, logy}, each optional.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-pk"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_comparison_name")]

    def __str__(self) -> str:
        return self.name
