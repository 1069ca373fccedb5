"""What ``hydra watch`` says of a trial: its label and its figures (`hydra_client.watch`)."""

from __future__ import annotations

from hydra_client.watch import LABEL_PARAMS_CHARS, TrialView, varying_params

PARAMS = {"lr": 0.0003, "loss_on": "answers", "lora_target_modules": "q_proj,k_proj,v_proj,o_proj", "lora_r": 8}


def trial(number: int = 1, **fields: object) -> dict[str, object]:
    return {"id": number, "number": number, "status": "running", "attempt": 1, "step": 3, "total_steps": 10,
            "params": dict(PARAMS), **fields}


def test_a_label_cuts_between_whole_parameters_never_inside_a_value():
    label = TrialView(trial()).label()
    assert label == '#1 lr=0.0003 loss_on="answers" …'
    assert len(label) <= len("#1 ") + LABEL_PARAMS_CHARS + len(" …")


def test_a_label_names_the_parameters_that_tell_the_trials_apart():
    trials = [trial(1), trial(2, params={**PARAMS, "lora_r": 16})]
    assert varying_params(trials) == {"lora_r"}
    assert [TrialView(t).label(varying_params(trials)) for t in trials] == ["#1 lora_r=8", "#2 lora_r=16"]
    assert varying_params(trials[:1]) is None  # one trial: all of its parameters


def test_the_figures_are_named_and_bits_per_byte_says_whether_final():
    view = TrialView(trial(best_val_loss=0.52))
    view.absorb({"trial": trial(best_val_loss=0.52), "next": 9,
                 "steps": [{"step": 9, "loss": 0.0395}], "evals": [{"step": 9, "bpb": 1.25}]})
    assert view.summary() == "running, val bpb 1.25 (latest eval), best val loss 0.52, train loss 0.0395"
    view.take(trial(status="finished", best_val_loss=0.5, final_bpb=1.2))
    assert view.summary() == "finished, val bpb 1.2, best val loss 0.5, train loss 0.0395"
