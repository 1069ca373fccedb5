"""A LoRA sweep's base precision (``base_dtype``): chosen with the checkpoint in the form or a pasted space, refused
for a model from scratch or a space that may train every weight, and counted at its precision by the memory
preview, the page and admission's host bytes. The byte counts are worked out here from the config alone."""

from __future__ import annotations

import pytest
from django.template.defaultfilters import filesizeformat
from django.urls import reverse

from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.test_forms import bound, post_data, text
from tests.webapp.experiments.test_lora_preview import CONFIG, FP32, base_params, model_dir, shapes
from webapp.experiments.memory_preview import memory_plan
from webapp.experiments.model_shapes import model_shape, model_to_spec, pretrained_shape
from webapp.experiments.search_space import SearchSpaceError
from webapp.experiments.services import experiment_plan
from webapp.ground.models import Trial
from webapp.worker_door import LoraSpec

pytestmark = pytest.mark.django_db
LORA_SPACE = "lora_r: {values: [4, 8]}\nlora_targets: {values: ['q_proj, v_proj']}\nbatch_size: {values: [4]}\n"


def nf4_bytes(rows: int, cols: int) -> int:
    """A matrix in nf4: two codes a byte, a byte a block of 64, an fp32 scale a block of 256 blocks, the offset."""
    n = rows * cols
    blocks = -(-n // 64)
    return -(-n // 2) + blocks + 4 * -(-blocks // 256) + 4


def int8_bytes(rows: int, cols: int) -> int:
    """A matrix in int8: a byte a value, an fp32 maximum a row."""
    return rows * cols + 4 * rows


def base_nf4_bytes() -> int:
    c, v, layers = CONFIG["hidden_size"], CONFIG["vocab_size"], CONFIG["num_hidden_layers"]
    block = sum(nf4_bytes(n_out, n_in) for n_in, n_out in shapes().values()) + 2 * c * FP32  # norms stay fp32
    # the tied embedding once, in int8 (a row per token), the blocks in nf4, the final norm
    return int8_bytes(v, c) + layers * block + c * FP32


def test_a_lora_plan_counts_the_base_at_its_precision(settings):
    shape = pretrained_shape(model_dir())
    lora = LoraSpec(r=8, target_modules=("q_proj", "v_proj"))
    fp32, nf4 = (memory_plan(s, batch=4, seq_len=32, optimizer="adamw", momentum=0.9, budget_bytes=256 << 20,
                             lora=lora) for s in (shape, model_shape({"kind": "pretrained", "pretrained_dir":
                                                                      "lora-llama", "base_dtype": "nf4"},
                                                                     models_root=settings.HYDRA.models_root)))
    assert fp32["base_bytes"] == base_params() * FP32 and fp32["base_dtype"] == "fp32"
    assert nf4["base_bytes"] == base_nf4_bytes() and nf4["base_dtype"] == "nf4"
    assert nf4["base_bytes_fp32"] == fp32["base_bytes"]
    tied = int8_bytes(CONFIG["vocab_size"], CONFIG["hidden_size"])  # the head reads the tied matrix again
    assert nf4["frozen_bytes"] == base_nf4_bytes() + tied
    assert nf4["state_bytes"] == fp32["state_bytes"]  # the adapters are fp32 either way
    # a unit dequantizes one matrix at a time, the layer's largest (the embedding; a block's MLP)
    c, i, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    extra = [a["activation_bytes"] - b["activation_bytes"] for a, b in zip(nf4["layers"], fp32["layers"], strict=True)]
    assert extra == [v * c * FP32] + [c * i * FP32] * CONFIG["num_hidden_layers"] + [v * c * FP32]

    trial = Trial(plan=nf4)
    assert trial.host_bytes() - Trial(plan=fp32).host_bytes() == nf4["base_bytes"] - fp32["base_bytes"]


def test_the_preview_says_what_the_base_takes_in_its_precision(alice_client, alice_dataset, settings):
    model_dir()
    response = alice_client.post(reverse("experiment_create"), post_data(
        alice_dataset, rows=[], space_text=LORA_SPACE, model_kind="pretrained", pretrained_dir="lora-llama",
        base_dtype="nf4", action="preview"))
    assert response.status_code == 200, response.content.decode()[-2000:]
    costs = response.context["preview"]["shared_base"]
    assert costs["base_dtype"] == "nf4" and costs["base_bytes"] == base_nf4_bytes()
    page = response.content.decode()
    assert (f"Base in nf4: {filesizeformat(base_nf4_bytes())} instead of "
            f"{filesizeformat(base_params() * FP32)} in fp32") in page


def test_the_form_refuses_a_low_bit_base_without_a_checkpoint_or_with_full_training(alice_team, alice_dataset,
                                                                                    settings):
    form = bound(alice_team, post_data(alice_dataset, base_dtype="nf4"))  # a preset, trained from scratch
    assert not form.is_valid()
    assert "a model trained from scratch trains every weight in fp32" in text(form.errors["base_dtype"])

    model_dir()
    may_train_everything = "lora_r: {values: [0, 8]}\n"
    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=may_train_everything,
                                       model_kind="pretrained", pretrained_dir="lora-llama", base_dtype="int8"))
    assert form.is_valid(), form.errors
    with pytest.raises(SearchSpaceError, match="lora_r: the base is kept in int8") as refused:
        experiment_plan(draft=form.cleaned_data["draft"])
    assert refused.value.parameter == "lora_r"

    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=LORA_SPACE, model_kind="pretrained",
                                       pretrained_dir="lora-llama", base_dtype="fp16"))
    assert not form.is_valid() and "fp16 is not one of the available choices" in text(form.errors["base_dtype"])

    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=LORA_SPACE, model_kind="pretrained",
                                       pretrained_dir="lora-llama", base_dtype="bf16"))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].model == {"kind": "pretrained", "pretrained_dir": "lora-llama",
                                                "base_dtype": "bf16"}
    assert form.cleaned_data["draft"].shape.base_dtype == "bf16"


def test_a_pasted_space_names_the_precision_with_its_checkpoint(alice, alice_team, alice_dataset):
    checkpoint = ready_checkpoint(alice)
    pasted = f"model: {{checkpoint: {checkpoint.name}, base_dtype: nf4}}\n" + LORA_SPACE
    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=pasted))
    assert form.is_valid(), form.errors
    model = form.cleaned_data["draft"].model
    assert model["base_dtype"] == "nf4" and form.cleaned_data["draft"].shape.base_dtype == "nf4"
    assert model_to_spec(model) == {"checkpoint": checkpoint.name, "base_dtype": "nf4"}

    bad = f"model: {{checkpoint: {checkpoint.name}, base_dtype: q4}}\n" + LORA_SPACE
    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=bad))
    assert not form.is_valid()
    assert "model: base_dtype is 'q4'; choose one of fp32, bf16, int8, nf4." in text(form.errors["space_text"])
    with_preset = "model: {preset: gpt2-micro, base_dtype: nf4}\n" + LORA_SPACE
    form = bound(alice_team, post_data(alice_dataset, rows=[], space_text=with_preset))
    assert not form.is_valid() and "do not go together" in text(form.errors["space_text"])
