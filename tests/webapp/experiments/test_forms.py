"""The experiment form: field errors for every bad input, and a draft when all is well."""

from __future__ import annotations

import dataclasses
import json

import pytest

from webapp.experiments.forms import ExperimentForm
from webapp.experiments.services import PLAN_ERRORS, experiment_plan
from webapp.experiments.space_rows import ParameterRowFormSet

pytestmark = pytest.mark.django_db


def post_data(dataset, rows=None, **fields):
    rows = rows if rows is not None else [{"name": "lr", "kind": "categorical", "values": "0.001, 0.003"}]
    data = {
        "name": "sweep", "dataset": dataset.pk, "model_kind": "preset", "preset": "gpt2-micro", "strategy": "grid",
        "n_trials": 4, "budget_unit": "steps", "budget": 10, "eval_every": 5, "seed": 0,
        "memory_budget": "explicit", "memory_budget_mib": 256,
        "space-TOTAL_FORMS": len(rows), "space-INITIAL_FORMS": 0,
    }
    for index, row in enumerate(rows):
        data.update({f"space-{index}-{key}": value for key, value in row.items()})
    data.update(fields)
    return data


def text(errors) -> str:
    """Error messages as plain text (a field's list, or a whole form's dict of lists)."""
    if isinstance(errors, dict):
        return " ".join(text(messages) for messages in errors.values())
    return " ".join(errors)


def bound(team, data):
    rows = ParameterRowFormSet(data, prefix="space")
    return ExperimentForm(data, team=team, rows=rows)


def planned_errors(form):
    """Validate, then plan as the view does; return the form (with any planning error placed on it)."""
    if form.is_valid():
        try:
            experiment_plan(draft=form.cleaned_data["draft"])
        except PLAN_ERRORS as error:
            form.add_draft_error(error)
    return form


def test_it_builds_a_draft(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset))
    assert form.is_valid(), (form.errors, form.rows.errors)
    draft = form.cleaned_data["draft"]
    assert draft.space.to_dict() == {"lr": {"kind": "categorical", "values": [0.001, 0.003]}}
    assert draft.memory_budget_bytes == 256 << 20
    assert len(experiment_plan(draft=draft)) == 2


def test_it_puts_a_reversed_range_on_its_row(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "lr", "kind": "float", "low": "0.1",
                                                            "high": "0.01"}], strategy="random"))
    assert not form.is_valid()
    assert "reversed" in text(form.rows.forms[0].errors["high"])


def test_it_puts_an_empty_range_on_its_row(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "dropout", "kind": "float", "low": "0.1",
                                                            "high": "0.1"}], strategy="random"))
    assert not form.is_valid()
    assert "empty" in text(form.rows.forms[0].errors["high"])


def test_it_rejects_a_grid_over_the_cap(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "warmup_steps", "kind": "int", "low": "0",
                                                            "high": "1000"}]))
    planned_errors(form)
    assert "the cap is 256" in text(form.errors["strategy"])


def test_it_rejects_an_unknown_parameter_in_pasted_yaml(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, space_text="learning_rate: {values: [0.1]}"))
    assert not form.is_valid()
    assert "Unknown parameter 'learning_rate'" in text(form.errors["space_text"])


def test_it_rejects_an_unknown_parameter_in_a_row(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "learning_rate", "kind": "categorical",
                                                            "values": "0.1"}]))
    assert not form.is_valid()
    assert "name" in form.rows.forms[0].errors


def test_it_lists_every_error_of_pasted_text_each_on_its_own(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, space_text="lora_rank: [8]\nlr: 0.001\noptimizer: adam\n"))
    assert not form.is_valid()
    messages = form.errors["space_text"]
    assert len(messages) == 2
    assert messages[0].startswith("Unknown parameter 'lora_rank'; did you mean lora_r?")
    assert messages[1] == "optimizer: 'adam' is not one of adamw, sgd."


def test_it_puts_each_bad_row_s_error_on_its_row(alice_team, alice_dataset):
    rows = [{"name": "lr", "kind": "categorical", "values": "fast"},
            {"name": "batch_size", "kind": "int", "low": "8", "high": "2"}]
    form = bound(alice_team, post_data(alice_dataset, rows))
    assert not form.is_valid()
    assert "'fast' is not a number" in text(form.rows.forms[0].errors["values"])
    assert "reversed" in text(form.rows.forms[1].errors["high"])


def test_pasted_text_sets_the_rows_aside_even_a_broken_one(alice_team, alice_dataset):
    rows = [{"name": "lr", "kind": "categorical", "values": ""}]  # no values: an error, were the rows used
    form = bound(alice_team, post_data(alice_dataset, rows, space_text="lr: 0.003\nbatch_size: [2, 4]"))
    assert form.is_valid(), form.errors
    assert [t for t in form.cleaned_data["draft"].space.grid()] == [{"lr": 0.003, "batch_size": 2},
                                                                      {"lr": 0.003, "batch_size": 4}]


def test_the_kind_menu_says_each_kind_in_full(alice_team):
    form = ExperimentForm(team=alice_team, rows=ParameterRowFormSet(initial=[{"name": "lr"}], prefix="space"))
    assert list(form.rows.forms[0].fields["kind"].choices) == [
        ("categorical", "categorical (values)"), ("int", "int range"), ("float", "float range"),
        ("logfloat", "log-float range")]


def test_it_accepts_pasted_json(alice_team, alice_dataset):
    space = {"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}}
    form = bound(alice_team, post_data(alice_dataset, rows=[], strategy="random", space_text=json.dumps(space)))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].space.to_dict() == space


def test_it_refuses_a_model_directory_outside_the_models_root(alice_team, alice_dataset, data_dir):
    (data_dir / "models").mkdir()
    (data_dir / "secret").mkdir()
    for path in ["../secret", str(data_dir / "secret"), "/etc", ""]:
        form = bound(alice_team, post_data(alice_dataset, model_kind="pretrained", pretrained_dir=path))
        assert not form.is_valid()
        assert "pretrained_dir" in form.errors, path


def test_it_refuses_a_symlink_that_leaves_the_models_root(alice_team, alice_dataset, data_dir):
    (data_dir / "models").mkdir()
    (data_dir / "secret").mkdir()
    (data_dir / "models" / "innocent").symlink_to(data_dir / "secret")
    form = bound(alice_team, post_data(alice_dataset, model_kind="pretrained", pretrained_dir="innocent"))
    assert not form.is_valid()
    assert "not inside the models root" in text(form.errors["pretrained_dir"])


def test_it_reads_a_pretrained_config_under_the_root(alice_team, alice_dataset, data_dir):
    model_dir = data_dir / "models" / "gpt2-local"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 128, "vocab_size": 512}
    ))
    form = bound(alice_team, post_data(alice_dataset, model_kind="pretrained", pretrained_dir="gpt2-local"))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].shape.pretrained_dir == str(model_dir.resolve())


def test_it_says_which_layer_cannot_fit_and_by_how_much(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, preset="gpt2-xl", memory_budget_mib=64))
    planned_errors(form)
    message = text(form.errors["memory_budget_mib"])
    assert "Layer embedding needs" in message and "over" in message and "64.0 MiB" in message


def test_it_rejects_a_width_that_does_not_split_into_heads(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "n_embd", "kind": "categorical",
                                                            "values": "64, 65"}]))
    planned_errors(form)
    assert "65 does not split into 2 heads" in text(form.rows.forms[0].errors)


def test_it_rejects_a_sequence_longer_than_the_context(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, rows=[{"name": "seq_len", "kind": "categorical",
                                                            "values": "512"}]))
    planned_errors(form)
    assert "longer than the model's context" in text(form.rows.forms[0].errors)


def test_it_requires_custom_sizes(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, model_kind="custom"))
    assert not form.is_valid()
    assert {"n_layer", "n_embd", "n_head", "n_positions"} <= set(form.errors)


def test_it_offers_only_the_teams_datasets(alice_team, bob_dataset):
    form = bound(alice_team, post_data(bob_dataset))
    assert not form.is_valid()
    assert "dataset" in form.errors


def with_caps(settings, **caps):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, caps=dataclasses.replace(settings.HYDRA.caps, **caps))


def test_it_refuses_ten_million_epochs_as_more_steps_than_the_cap(alice_team, alice_dataset, settings):
    form = bound(alice_team, post_data(alice_dataset, budget_unit="epochs", budget=10_000_000))
    assert not form.is_valid()
    message = text(form.errors["budget"])
    assert "HYDRA_MAX_STEPS_PER_TRIAL" in message and f"{settings.HYDRA.caps.steps_per_trial:,}" in message


def test_a_budget_in_steps_over_the_cap_gets_the_caps_one_message_even_beside_other_errors(
        alice_team, alice_dataset, settings):
    cap = settings.HYDRA.caps.steps_per_trial
    form = bound(alice_team, post_data(alice_dataset, budget=100_000_000, name=""))
    assert not form.is_valid()
    assert form.errors["budget"] == [f"A trial would take 100,000,000 optimizer steps; the cap is {cap:,} per trial "
                                     "(HYDRA_MAX_STEPS_PER_TRIAL). Lower the budget."]
    assert f"at most {cap:,} optimizer steps" in form.fields["budget"].help_text  # the same cap, said once
    assert bound(alice_team, post_data(alice_dataset, budget=cap)).is_valid()


def test_an_absurd_budget_in_epochs_is_refused_by_the_steps_cap_not_a_crash(alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, budget_unit="epochs", budget=1e300))
    assert not form.is_valid() and "HYDRA_MAX_STEPS_PER_TRIAL" in text(form.errors["budget"])


def test_it_refuses_a_trial_over_the_token_cap(alice_team, alice_dataset, settings):
    with_caps(settings, tokens_per_trial=10_000)
    rows = [{"name": "batch_size", "kind": "categorical", "values": "2, 8"},
            {"name": "seq_len", "kind": "categorical", "values": "16"}]
    form = bound(alice_team, post_data(alice_dataset, rows, budget=50))  # 50 x 8 x 16 = 6,400: under the cap
    assert form.is_valid(), form.errors
    form = bound(alice_team, post_data(alice_dataset, rows, budget=100))  # 100 x 8 x 16 = 12,800
    assert not form.is_valid()
    assert "12,800 tokens" in text(form.errors["budget"]) and "HYDRA_MAX_TOKENS_PER_TRIAL" in text(form.errors)


def test_it_refuses_more_trials_than_the_cap(alice_team, alice_dataset, settings):
    with_caps(settings, trials_per_experiment=3)
    grid = bound(alice_team, post_data(alice_dataset, [{"name": "lr", "kind": "categorical",
                                                        "values": "0.1, 0.01, 0.001, 0.0001"}]))
    assert not grid.is_valid()
    assert "4 trials; the cap is 3" in text(grid.errors["strategy"])
    random = bound(alice_team, post_data(alice_dataset, strategy="random", n_trials=4))
    assert not random.is_valid() and "4 trials; the cap is 3" in text(random.errors["n_trials"])
    assert bound(alice_team, post_data(alice_dataset, strategy="random", n_trials=3)).is_valid()


def test_it_states_the_caps_in_its_help_text(alice_team, settings):
    with_caps(settings, steps_per_trial=5000, tokens_per_trial=2_000_000, trials_per_experiment=12)
    form = ExperimentForm(team=alice_team, rows=ParameterRowFormSet(prefix="space"))
    assert "5,000 optimizer steps and 2,000,000 tokens" in form.fields["budget"].help_text
    assert "at most 12 trials" in form.fields["n_trials"].help_text
