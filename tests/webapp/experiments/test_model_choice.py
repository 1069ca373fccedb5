"""The model of an experiment: a family preset, a custom family size or a catalog checkpoint, each planned with
its family's costs and reaching the engine's trial spec; a pretrained model's context caps the sequence length,
its shape is not searched, and ids that would not match its embeddings are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.webapp.experiments.checkpoints import bare_model_dir, ready_checkpoint
from tests.webapp.experiments.test_forms import bound, planned_errors, post_data, text
from webapp.datasets.models import DatasetTokens
from webapp.datasets.services import dataset_tokens_build
from webapp.experiments import services
from webapp.experiments.memory_preview import layer_costs
from webapp.experiments.model_shapes import PRESETS
from webapp.experiments.space_rows import experiment_initial
from webapp.experiments.trial_data import trial_data_request
from worker.engine.families import architecture_from_spec
from worker.engine.sizes import FP32

pytestmark = pytest.mark.django_db


def _draft(form):
    assert form.is_valid(), (form.errors, [row.errors for row in form.rows.forms])
    return form.cleaned_data["draft"]


def test_a_llama_preset_carries_its_family_micro_batches_and_bf16_to_the_trial_spec(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    rows = [{"name": "batch_size", "kind": "categorical", "values": "4"},
            {"name": "micro_batches", "kind": "categorical", "values": "1, 2"},
            {"name": "precision", "kind": "categorical", "values": "bf16"}]
    draft = _draft(bound(alice_team, post_data(alice_dataset, rows, preset="llama-micro")))
    assert draft.shape.family == "llama" and draft.shape.n_kv_head == 2
    experiment = services.experiment_create(team=alice_team, user=alice, draft=draft)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    specs = [t.spec for t in experiment.trials.order_by("number")]
    assert [(s["micro_batches"], s["bf16"], s["batch_size"]) for s in specs] == [(1, True, 4), (2, True, 4)]
    # both evaluate two batches' rows, one micro-batch at a time: the same rows however the batch is cut
    assert [s["eval_batches"] * s["batch_size"] // s["micro_batches"] for s in specs] == [8, 8]
    model = specs[0]["model"]
    assert (model["family"], model["n_head"], model["n_kv_head"], model["n_inner"]) == ("llama", 4, 2, 128)
    assert model["vocab_size"] == alice_dataset.vocab_size and model["pretrained_dir"] is None
    assert specs[0]["data"]["tokens_path"] == str(alice_dataset.tokens_path)
    assert specs[0]["data"]["tokenizer_dir"] == str(alice_dataset.directory)  # the export carries its tokenizer
    assert {t.submitted for t in experiment.trials.all()} == {True}
    assert scheduler.trial(experiment.trials.first().queue_id).job["trial"] == specs[0]


def test_devices_per_trial_reach_every_trial_s_job_and_the_queue_admits_each_as_wide_as_allowed(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    """A trial of 4 micro-batches may run on 4 devices; the experiment caps it at 2 (the field, or pasted text),
    and each submission says what a device beyond the first costs its spill store (its boundaries)."""
    rows = [{"name": "batch_size", "kind": "categorical", "values": "8"},
            {"name": "micro_batches", "kind": "categorical", "values": "4"}]
    capped = _draft(bound(alice_team, post_data(alice_dataset, rows, max_devices_per_trial="2", memory_budget_mib=2)))
    pasted = _draft(bound(alice_team, post_data(
        alice_dataset, [], space_text="batch_size: [8]\nmicro_batches: [4]\nmax_devices_per_trial: 3")))
    free = _draft(bound(alice_team, post_data(alice_dataset, rows, memory_budget_mib=2)))
    assert (capped.max_devices_per_trial, pasted.max_devices_per_trial, free.max_devices_per_trial) == (2, 3, None)
    widths = []
    for draft in (capped, free):
        experiment = services.experiment_create(team=alice_team, user=alice, draft=draft)
        with django_capture_on_commit_callbacks(execute=True):
            services.experiment_launch(experiment=experiment, actor=alice)
        trial = experiment.trials.get()
        record = scheduler.trial(trial.queue_id)
        lane_bytes = int(scheduler.client.hget(scheduler.key(f"trial:{trial.queue_id}"), "lane_bytes"))
        widths.append((record.job.get("max_devices"), record.width_cap, lane_bytes == trial.lane_bytes()))
        assert trial.lane_bytes() > 0  # a tiny budget: several shards, so boundaries between them
    assert widths == [(2, 2, True), (None, 4, True)]
    form = bound(alice_team, post_data(alice_dataset, rows, max_devices_per_trial="0"))
    assert not form.is_valid() and "max_devices_per_trial" in form.errors
    form = bound(alice_team, post_data(alice_dataset, [], space_text="lr: [0.001]\nmax_devices_per_trial: many"))
    assert "max_devices_per_trial: 'many' is not a whole number of devices" in text(form.errors)


def test_micro_batches_must_divide_every_batch_size(alice_team, alice_dataset):
    rows = [{"name": "batch_size", "kind": "categorical", "values": "4, 6"},
            {"name": "micro_batches", "kind": "categorical", "values": "2, 4"}]
    form = planned_errors(bound(alice_team, post_data(alice_dataset, rows)))
    assert "micro_batches: 4 does not divide the batch size 6" in text(form.rows.forms[1].errors)
    ranged = [{"name": "batch_size", "kind": "int", "low": "2", "high": "8", "step": "2"},
              {"name": "micro_batches", "kind": "categorical", "values": "2"}]
    form = planned_errors(bound(alice_team, post_data(alice_dataset, ranged, strategy="random")))
    assert "list the micro-batches and the batch sizes as values" in text(form.rows.forms[1].errors)


def test_a_custom_family_size_checks_its_grouped_heads(alice_team, alice_dataset):
    custom = {"model_kind": "custom", "n_layer": 2, "n_embd": 48, "n_head": 6, "n_positions": 128}
    draft = _draft(bound(alice_team, post_data(alice_dataset, **custom, family="qwen2", n_kv_head=2, n_inner=96)))
    assert (draft.shape.family, draft.shape.n_kv_head, draft.shape.n_inner) == ("qwen2", 2, 96)
    assert draft.model == {"kind": "custom", "family": "qwen2", "n_layer": 2, "n_embd": 48, "n_head": 6,
                           "n_positions": 128, "n_kv_head": 2, "n_inner": 96}
    assert len(services.experiment_plan(draft=draft)) == 2
    form = bound(alice_team, post_data(alice_dataset, **custom, family="llama", n_kv_head=4))
    assert not form.is_valid() and "4 key/value heads do not divide 6 heads" in text(form.errors["n_kv_head"])
    form = bound(alice_team, post_data(alice_dataset, **custom, family="gpt2", n_kv_head=2))
    assert not form.is_valid() and "GPT-2 has no grouped-query attention" in text(form.errors["n_kv_head"])


@pytest.mark.parametrize("preset", ["llama-micro", "smollm2-135m", "llama-7b"])
def test_the_memory_preview_counts_the_familys_own_parameters(preset):
    shape = PRESETS[preset][1].with_params({}, vocab_size=49152)
    costs = layer_costs(shape, batch=2, seq_len=64, slots=2)
    spec = architecture_from_spec(_model_spec(shape))
    assert [(c.name, c.param_bytes, c.lent_bytes) for c in costs] == [
        (name, owned * FP32, 2 * borrowed * FP32) for name, owned, borrowed in spec.layer_params()]
    if preset == "smollm2-135m":
        assert abs(spec.n_params - 134_515_008) < 1e5  # SmolLM2-135M's published size
    if preset == "llama-7b":  # an untied head owns its matrix
        assert costs[-1].lent_bytes == 0 and costs[-1].param_bytes > 4096 * 49152 * FP32


def _model_spec(shape):
    from webapp.worker_door import ModelSpec

    return ModelSpec(family=shape.family, n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head,
                     n_kv_head=shape.n_kv_head, n_inner=shape.n_inner, vocab_size=shape.vocab_size,
                     n_positions=shape.n_positions, tie_word_embeddings=shape.tie_word_embeddings)


def test_a_catalog_checkpoint_fixes_the_shape_and_caps_the_sequence_length(alice, alice_team, alice_dataset):
    checkpoint = ready_checkpoint(alice)
    draft = _draft(bound(alice_team, post_data(alice_dataset, model_kind="checkpoint", checkpoint=checkpoint.pk)))
    assert draft.model == {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": "tiny llama"}
    assert draft.shape.family == "llama" and draft.shape.tokenizer_sha256 == checkpoint.tokenizer_sha256
    assert (draft.shape.n_positions, draft.shape.vocab_size) == (64, 320)
    assert len(services.experiment_plan(draft=draft)) == 2

    deeper = [{"name": "n_layer", "kind": "categorical", "values": "4"}]
    form = planned_errors(bound(alice_team, post_data(alice_dataset, deeper, model_kind="checkpoint",
                                                     checkpoint=checkpoint.pk)))
    assert "a pretrained model's shape is fixed" in text(form.rows.forms[0].errors)
    longer = [{"name": "seq_len", "kind": "categorical", "values": "32, 128"}]
    form = planned_errors(bound(alice_team, post_data(alice_dataset, longer, model_kind="checkpoint",
                                                     checkpoint=checkpoint.pk)))
    assert ("seq_len: 128 is longer than the model's context (64 positions: the context length of tiny llama)"
            in text(form.rows.forms[0].errors["values"]))
    form = bound(alice_team, post_data(alice_dataset, model_kind="checkpoint"))
    assert not form.is_valid() and "Choose a checkpoint of the catalog" in text(form.errors["checkpoint"])


def test_ids_that_would_not_match_the_embeddings_are_refused(alice_team, alice_dataset):
    bare_model_dir("no-tokenizer", vocab_size=1000, tokenizer=False)
    form = planned_errors(bound(alice_team, post_data(alice_dataset, model_kind="pretrained",
                                                     pretrained_dir="no-tokenizer")))
    assert "has no tokenizer (tokenizer.json) of its own" in text(form.errors["pretrained_dir"])

    bare_model_dir("small-vocab", vocab_size=256, tokenizer=True)  # its tokenizer has 300 tokens
    form = bound(alice_team, post_data(alice_dataset, model_kind="pretrained", pretrained_dir="small-vocab"))
    tokens = trial_data_request(shape=_draft(form).shape, dataset=alice_dataset)
    dataset_tokens_build(tokens_id=tokens.pk)  # as the web worker does
    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.READY and tokens.max_id == np.load(tokens.path).max() >= 256
    form = planned_errors(bound(alice_team, post_data(alice_dataset, model_kind="pretrained",
                                                     pretrained_dir="small-vocab")))
    assert "but the model has only 256 embeddings: they would not match" in text(form.errors["pretrained_dir"])


def test_pasted_yaml_or_json_may_name_the_model(alice, alice_team, alice_dataset):
    pasted = "model: {preset: llama-micro}\nlr: {values: [0.001]}\nmicro_batches: {values: [2]}\n"
    draft = _draft(bound(alice_team, post_data(alice_dataset, rows=[], space_text=pasted)))
    assert draft.model == {"kind": "preset", "preset": "llama-micro"} and draft.shape.family == "llama"
    assert draft.space.to_dict() == {"lr": {"kind": "categorical", "values": [0.001]},
                                     "micro_batches": {"kind": "categorical", "values": [2]}}
    custom = json.dumps({"model": {"family": "mistral", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2,
                                   "n_positions": 128}, "lr": {"values": [0.001]}})
    draft = _draft(bound(alice_team, post_data(alice_dataset, rows=[], space_text=custom)))
    assert (draft.shape.family, draft.shape.n_kv_head, draft.model["kind"]) == ("mistral", 2, "custom")
    checkpoint = ready_checkpoint(alice)
    draft = _draft(bound(alice_team, post_data(alice_dataset, rows=[],
                                               space_text="model: {checkpoint: tiny llama}\nlr: {values: [0.1]}")))
    assert draft.model == {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": "tiny llama"}

    for model, words in [
        ("{checkpoint: huge llama}", "no ready checkpoint named 'huge llama' in the catalog"),
        ("{preset: llama-micro, checkpoint: tiny llama}", "'checkpoint' and 'preset' do not go together"),
        ("{preset: gpt5}", "unknown preset 'gpt5'"),
        ("{family: llama, n_layer: 2, n_embd: 64, n_head: 4, n_kv_head: 3, n_positions: 64}",
         "3 key/value heads do not divide 4 heads"),
        ("{family: llama, n_layer: true, n_embd: 64, n_head: 4, n_positions: 64}", "n_layer is True"),
        ("{family: llama, n_embd: 64, n_head: 4, n_positions: 64}", "n_layer is missing"),
        ("{family: bert, n_layer: 2}", "unknown family 'bert'"),
        ("[llama]", "give a mapping"),
    ]:
        form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=f"model: {model}\nlr: {{values: [1]}}"))
        assert not form.is_valid(), model
        assert words in text(form.errors["space_text"]), (model, form.errors)


def test_a_clone_chooses_the_same_checkpoint_or_family_size(alice, alice_team, alice_dataset):
    checkpoint = ready_checkpoint(alice)
    draft = _draft(bound(alice_team, post_data(alice_dataset, model_kind="checkpoint", checkpoint=checkpoint.pk)))
    experiment = services.experiment_create(team=alice_team, user=alice, draft=draft)
    initial, _ = experiment_initial(experiment)
    assert (initial["name"], initial["model_kind"], initial["checkpoint"]) == ("sweep (copy)", "checkpoint",
                                                                             checkpoint.pk)
    custom = {"model_kind": "custom", "family": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 1,
              "n_positions": 64}
    draft = _draft(bound(alice_team, post_data(alice_dataset, **custom)))
    initial, _ = experiment_initial(services.experiment_create(team=alice_team, user=alice, draft=draft))
    clone = _draft(bound(alice_team, post_data(alice_dataset, **{k: initial[k] for k in custom})))
    assert clone.shape == draft.shape
