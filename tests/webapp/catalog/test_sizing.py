"""Where a checkpoint's training state fits: whole on a device whose budget holds it (resident), sharded when
only the engine's smallest shard fits (spilled: the largest layer's weights and gradients, and the prefetch of
as much), nowhere when not even that does; unknown without devices."""

from __future__ import annotations

import pytest

from webapp.catalog.models import Checkpoint
from webapp.catalog.sizing import DeviceBudget, base_sizes, fits, smallest_budget, state_bytes

GIB = 1 << 30


def _checkpoint(n_params: int, largest_layer: int | None) -> Checkpoint:
    return Checkpoint(name="c", path="c", status=Checkpoint.Status.READY, n_params=n_params,
                      largest_layer_params=largest_layer)


def test_the_training_state_counts_parameters_gradients_and_optimizer_slots() -> None:
    assert state_bytes(1000, optimizer="adamw", momentum=0.0) == 16_000
    assert state_bytes(1000, optimizer="sgd", momentum=0.9) == 12_000
    assert state_bytes(1000, optimizer="sgd", momentum=0.0) == 8_000


def test_a_state_within_a_budget_is_resident_and_one_over_it_is_spilled() -> None:
    smol = _checkpoint(134_515_008, largest_layer=28_311_552)  # SmolLM2-135M: AdamW 2.0 GiB, SGD 1.5 GiB
    devices = [DeviceBudget("cpu:0", 2 * GIB, "test"), DeviceBudget("cpu:1", GIB // 2, "test")]
    adamw, sgd = fits(smol, devices)
    assert (adamw.optimizer, adamw.state_bytes, adamw.verdict) == ("AdamW", 16 * 134_515_008, "spilled")
    # The 49,152 x 576 embedding's weights and gradients, twice: 453 MB, under cpu:1's 512 MiB.
    assert smallest_budget(28_311_552) == 16 * 28_311_552
    assert adamw.detail == ("sharded, its shards taking turns on cpu:0, cpu:1; "
                            "from 432.0\xa0MB of device memory plus activations")
    assert (sgd.verdict, sgd.detail) == ("resident", "whole on cpu:0")
    assert fits(smol, [DeviceBudget("cpu:1", 400 << 20, "test")])[0].verdict == "too large"
    big = _checkpoint(7 * 10**9, largest_layer=10**9)  # a 7B model's largest layer (its embedding) alone is 16 GB
    assert [fit.verdict for fit in fits(big, devices)] == ["too large", "too large"]


def test_without_devices_nothing_is_said_to_fit() -> None:
    assert {fit.verdict for fit in fits(_checkpoint(10**6, 10**5), [])} == {"fit unknown"}
    unread = fits(_checkpoint(10**6, 10**5), [DeviceBudget("cuda:0", None, "no NVML")])
    assert {(fit.verdict, fit.detail) for fit in unread} == {("fit unknown", "no device's memory could be read")}



@pytest.mark.django_db
def test_a_checkpoints_page_gives_its_lora_base_in_each_precision(alice, alice_client) -> None:
    """The engine's own byte counts: what its shared base stores, built here from the same checkpoint."""
    from django.template.defaultfilters import filesizeformat
    from django.urls import reverse

    from tests.webapp.experiments.checkpoints import ready_checkpoint
    from webapp.catalog.selectors import checkpoint_dir
    from worker.engine.config import LoraSpec, ModelSpec
    from worker.engine.layers import build_layer_stack
    from worker.engine.sizes import stored_bytes

    checkpoint = ready_checkpoint(alice)
    stack = build_layer_stack(ModelSpec(pretrained_dir=str(checkpoint_dir(checkpoint))), LoraSpec(r=2))
    refs = {ref.key: ref for layer in stack.frozen for ref in layer}
    expected = [(d, sum(stored_bytes(r.shape, d, vocabulary=r.vocabulary) for r in refs.values()))
                for d in ("fp32", "bf16", "int8", "nf4")]
    assert base_sizes(checkpoint) == expected
    page = alice_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert f"nf4 {filesizeformat(expected[-1][1])}" in page and f"fp32 {filesizeformat(expected[0][1])}" in page
