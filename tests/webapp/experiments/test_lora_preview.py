"""The memory preview counts a LoRA trial as the engine trains it: its adapters are its state (with gradients
and optimizer state), the base weights frozen bytes read from the host's one shared copy; and it says what the
sweep's LoRA trials cost the host with that sharing and without it. The numbers here are worked out from the
model's config alone, apart from the preview's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.template.defaultfilters import filesizeformat
from django.urls import reverse

from tests.webapp.catalog.checkpoints import TEXT
from tests.webapp.experiments.factories import draft
from tests.webapp.experiments.test_forms import post_data
from tests.webapp.experiments.test_memory_preview import _smallest_fitting_budget
from webapp.experiments import planning
from webapp.experiments.memory_preview import FitError, layer_costs, memory_plan, shared_base_costs
from webapp.experiments.model_shapes import PRESETS, pretrained_shape
from webapp.experiments.search_space import SearchSpaceError
from webapp.worker_door import LoraSpec
from worker.engine.tokenizer import train_tokenizer

pytestmark = pytest.mark.django_db
FP32 = 4
ADAMW_SLOTS = 2
# A Llama checkpoint's config: 4 blocks, 128 wide, 4 heads of 32 sharing 2 key/value heads, a tied head.
CONFIG = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 256, "max_position_embeddings": 128, "vocab_size": 512,
          "tie_word_embeddings": True}
BUDGET = 256 << 20


def model_dir(relative: str = "lora-llama") -> Path:
    """A pretrained directory under the models root: its config and a tokenizer (no weights: enough to plan)."""
    directory = Path(settings.HYDRA.models_root) / relative
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    train_tokenizer(TEXT, vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory


def shapes() -> dict[str, tuple[int, int]]:
    """Each linear module of a block of CONFIG: (in features, out features)."""
    c, i = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    head_dim = c // CONFIG["num_attention_heads"]
    q, kv = CONFIG["num_attention_heads"] * head_dim, CONFIG["num_key_value_heads"] * head_dim
    return {"q_proj": (c, q), "k_proj": (c, kv), "v_proj": (c, kv), "o_proj": (q, c), "gate_proj": (c, i),
            "up_proj": (c, i), "down_proj": (i, c)}


def adapter_params(r: int, targets: tuple[str, ...]) -> int:
    """peft's A (r x in) and B (out x r) for each targeted module of each block."""
    per_block = sum(r * (n_in + n_out) for name, (n_in, n_out) in shapes().items() if name in targets)
    return CONFIG["num_hidden_layers"] * per_block


def base_params() -> int:
    """The checkpoint's parameters, the tied embedding matrix once: what the host's shared base holds."""
    c, v = CONFIG["hidden_size"], CONFIG["vocab_size"]
    block = 2 * c + sum(n_in * n_out for n_in, n_out in shapes().values())  # two RMSNorms and seven matrices
    return v * c + CONFIG["num_hidden_layers"] * block + c  # embeddings, blocks, final norm


def test_a_lora_plan_holds_the_adapters_as_state_and_the_base_as_frozen_bytes(settings):
    shape = pretrained_shape(model_dir())
    targets = ("q_proj", "v_proj")
    full = memory_plan(shape, batch=4, seq_len=32, optimizer="adamw", momentum=0.9, budget_bytes=BUDGET)
    lora = memory_plan(shape, batch=4, seq_len=32, optimizer="adamw", momentum=0.9, budget_bytes=BUDGET,
                       lora=LoraSpec(r=8, target_modules=targets))
    adapters = adapter_params(8, targets)
    assert lora["state_bytes"] == adapters * FP32 * (1 + 1 + ADAMW_SLOTS)  # parameters, gradients, AdamW's m, v
    assert full["state_bytes"] == base_params() * FP32 * (1 + 1 + ADAMW_SLOTS)
    assert lora["state_bytes"] < full["state_bytes"] / 40
    # Every weight a layer registers is frozen, the head's tied matrix too (its units read it again).
    tied = CONFIG["vocab_size"] * CONFIG["hidden_size"]
    assert lora["frozen_bytes"] == (base_params() + tied) * FP32 and full["frozen_bytes"] == 0
    assert lora["base_bytes"] == base_params() * FP32 and "base_bytes" not in full
    assert len(lora["shards"]) == 1
    assert lora["spilled_bytes"] == {"parameters": adapters * FP32, "optimizer": adapters * ADAMW_SLOTS * FP32,
                                     "boundary_activations": 0}
    assert sum(s["frozen_bytes"] for s in lora["shards"]) == lora["frozen_bytes"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # peft's, on a tied head and GPT-2's fused projections
def test_the_adapter_counts_are_the_engines(settings):
    """Per layer, the preview's adapters and frozen weights are those of the engine's own layer stack (the
    model built on the meta device with peft's modules injected), for each family's module names."""
    from worker.engine.config import ModelSpec
    from worker.engine.families import architecture_from_spec
    from worker.engine.layers import build_layer_stack

    cases = [
        (ModelSpec(family="gpt2", n_layer=2, n_embd=64, n_head=2, vocab_size=300, n_positions=64),
         [("c_attn",), ("c_proj", "c_fc", "lm_head")]),
        (ModelSpec(family="llama", n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=96, vocab_size=300,
                   n_positions=64), [("q_proj", "v_proj"), ("k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]),
        (ModelSpec(family="qwen2", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, n_inner=96, vocab_size=300,
                   n_positions=64, tie_word_embeddings=False), [("q_proj", "lm_head")]),
    ]
    for spec, choices in cases:
        for targets in choices:
            stack = build_layer_stack(spec, LoraSpec(r=3, target_modules=targets))
            engine = [(name, stack.layer_numel(i), stack.frozen_numel(i)) for i, name in enumerate(stack.names)]
            assert architecture_from_spec(spec).lora_layer_params(r=3, targets=targets) == engine, targets


def test_the_preview_of_a_lora_sweep_says_what_sharing_the_base_saves(alice_client, alice_dataset, settings):
    model_dir()
    space = "lora_r: {values: [0, 4, 8]}\nlora_targets: {values: ['q_proj, v_proj']}\nbatch_size: {values: [4]}\n"
    response = alice_client.post(reverse("experiment_create"), post_data(
        alice_dataset, rows=[], space_text=space, model_kind="pretrained", pretrained_dir="lora-llama",
        action="preview"))
    assert response.status_code == 200, response.content.decode()[-2000:]
    preview = response.context["preview"]
    assert [row["draft"].params["lora_r"] for row in preview["trials"]] == [0, 4, 8]
    assert all(row["plan"]["shards"] == 1 for row in preview["trials"])  # no boundary activations to spill

    # Two LoRA trials share the base; the full-training trial holds no base and is not one of them.
    base = base_params() * FP32
    own = [adapter_params(r, ("q_proj", "v_proj")) * FP32 * (1 + ADAMW_SLOTS) for r in (4, 8)]
    read = base + CONFIG["vocab_size"] * CONFIG["hidden_size"] * FP32  # the tied matrix, read by two shards
    expected = {"trials": 2, "base_bytes": base, "state_bytes": sum(own), "shared_bytes": base + sum(own),
                "unshared_bytes": 2 * base + sum(own), "read_bytes": read, "base_dtype": "fp32",
                "base_bytes_fp32": base}
    assert preview["shared_base"] == expected
    page = response.content.decode()
    assert "Host memory of the 2 LoRA trials on lora-llama" in page
    assert (f"<strong>{filesizeformat(base + sum(own))}</strong> with one shared base ({filesizeformat(base)} of "
            "frozen weights, once") in page
    assert f"{filesizeformat(2 * base + sum(own))} if each trial kept its own copy of the base" in page
    # The table's figure for the base is the sentence's; what the shards read is the base and why it is more.
    assert page.count(f'<td data-field="shared-base">{filesizeformat(base)}</td>') == 2
    assert '<td data-field="shared-base">— (full training)</td>' in page  # the lora_r 0 trial
    assert (f"A trial's shards read {filesizeformat(read)} of it onto the devices: the embedding and the head "
            "share one matrix, which both read.") in page

    full_only = alice_client.post(reverse("experiment_create"), post_data(
        alice_dataset, rows=[], space_text="lr: {values: [0.001, 0.01]}\n", model_kind="pretrained",
        pretrained_dir="lora-llama", action="preview"))
    assert full_only.context["preview"]["shared_base"] is None
    assert "with one shared base" not in full_only.content.decode()


def test_a_lora_only_space_is_checked_as_lora_so_it_fits_where_full_training_would_not(alice_dataset, settings):
    shape = pretrained_shape(model_dir())
    batch, seq_len = 8, 64
    lora = _smallest_fitting_budget(layer_costs(shape, batch=batch, seq_len=seq_len, slots=ADAMW_SLOTS,
                                  lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj"))))
    full = _smallest_fitting_budget(layer_costs(shape, batch=batch, seq_len=seq_len, slots=ADAMW_SLOTS))
    assert lora < full
    model = {"kind": "pretrained", "pretrained_dir": "lora-llama"}

    def planned(ranks: list[int]) -> list[planning.TrialDraft]:
        space = {"lora_r": {"values": ranks}, "lora_targets": {"values": ["q_proj,v_proj"]},
                 "batch_size": {"values": [batch]}, "seq_len": {"values": [seq_len]}}
        return planning.plan_trials(draft(alice_dataset, model=model, shape=shape, space=space, strategy="random",
                                          n_trials=3), budget_bytes=lora, caps=settings.HYDRA.caps)

    assert all(t.plan["frozen_bytes"] > 0 for t in planned([4, 8]))
    with pytest.raises(FitError):  # a space that may draw full training is checked with it
        planned([0, 8])


def test_lora_is_refused_before_launch_without_a_checkpoint_or_with_modules_the_model_lacks(alice_dataset):
    preset = draft(alice_dataset, space={"lora_r": {"values": [4]}})
    with pytest.raises(SearchSpaceError, match="LoRA trains adapters on a pretrained checkpoint"):
        planning.check_space(preset)
    shape = pretrained_shape(model_dir())
    model = {"kind": "pretrained", "pretrained_dir": "lora-llama"}
    gpt2_names = {"lora_r": {"values": [4]}, "lora_targets": {"values": ["q_proj,c_attn"]}}
    with pytest.raises(SearchSpaceError) as refused:
        planning.check_space(draft(alice_dataset, model=model, shape=shape, space=gpt2_names))
    assert str(refused.value) == ("lora_targets: c_attn is not a linear module of a Llama model; its modules are "
                                  "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head.")
    assert refused.value.parameter == "lora_targets"
    # Without a lora_targets row the default, q_proj and v_proj, is a Llama's.
    planning.check_space(draft(alice_dataset, model=model, shape=shape, space={"lora_r": {"values": [4]}}))
    assert PRESETS["gpt2-micro"][1].architecture().lora_targets() == ("c_attn", "c_proj", "c_fc", "lm_head")
    assert shared_base_costs([]) is None
