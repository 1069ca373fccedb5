"""A trial's downloads (`webapp.experiments.archives`): a LoRA trial's adapter alone, naming its base as the world
knows it so that peft loads it on a base model of the user's own, and its merged model without the adapter; each
with its size before it is packed and its progress while it is."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.api.conftest import alice_api  # noqa: F401 -- a fixture
from tests.webapp.catalog.checkpoints import tiny_llama
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_generations import finished
from webapp.catalog.models import Checkpoint
from webapp.experiments import archives
from webapp.ground.models import Trial, TrialArchive


@pytest.fixture
def base_dir(settings) -> Path:
    """A tiny Llama checkpoint in the catalog's models root, as a lab registers one."""
    settings.HYDRA.models_root.mkdir(parents=True, exist_ok=True)
    return tiny_llama(settings.HYDRA.models_root / "tiny-llama")


def lora_export(trial: Trial, base_dir: Path) -> tuple[Trial, object]:
    """`trial` finished with a LoRA export as the engine writes one: the merged model and its tokenizer in the
    export directory, the PEFT adapter in ``adapter/`` naming its base by the server's path. Returns the trial
    and the trained PeftModel, whose adapter weights are random (a fresh adapter would change nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    finished(trial)
    export = Path(trial.export_path)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                        base_model_name_or_path=str(base_dir))
    tuned = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), config)
    with torch.no_grad():
        for name, weight in tuned.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5)
    tuned.save_pretrained(export / archives.ADAPTER_DIR)
    tuned.merge_and_unload().save_pretrained(export)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(export)
    return trial, tuned


def on_checkpoint(trial: Trial, checkpoint: Checkpoint) -> Trial:
    trial.experiment.model = {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name}
    trial.experiment.save()
    return trial


def packed(trial: Trial, kind: str, into: Path) -> Path:
    """The archive of `kind` asked for, packed as the web worker does, and unpacked: its folder."""
    archive = archives.trial_archive_request(trial=trial, kind=kind)
    archives.trial_archive_build(archive_id=archive.pk)
    archive.refresh_from_db()
    assert archive.status == TrialArchive.Status.READY, archive.message
    with tarfile.open(archive.path) as tar:
        tar.extractall(into, filter="data")
    (folder,) = into.iterdir()
    assert folder.name == archives.download_name(trial, kind) == f"sweep-trial-1-id-{trial.pk}-{kind}"
    return folder


def test_the_adapter_alone_loads_with_peft_on_a_base_of_the_users_own(alice_team, alice_dataset, base_dir,
                                                                       tmp_path, monkeypatch):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing comes from the Hub: the base is the user's own copy
    checkpoint = Checkpoint.objects.create(name="TinyLab/tiny-llama", path="tiny-llama",
                                           status=Checkpoint.Status.READY)
    trial, tuned = lora_export(on_checkpoint(make_experiment(alice_team, alice_dataset).trials.first(), checkpoint),
                               base_dir)
    offered = {d.kind: d for d in archives.trial_downloads(trial=trial)}
    assert list(offered) == ["adapter", "model"] and offered["model"].title == "Merged model"
    assert 0 < offered["adapter"].content_bytes < offered["model"].content_bytes / 2

    adapter = packed(trial, "adapter", tmp_path / "adapter")
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"}
    assert not (adapter / "model.safetensors").exists()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "TinyLab/tiny-llama"  # the catalog's name, not a server path
    users_copy = tmp_path / "my-models" / "tiny-llama"
    users_copy.parent.mkdir()
    base_dir.rename(users_copy)  # the base on the user's machine, elsewhere than on the server
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(users_copy), adapter).eval()
    prompt = AutoTokenizer.from_pretrained(adapter)("the lab trains", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**prompt).logits, tuned.eval()(**prompt).logits)

    merged = packed(trial, "model", tmp_path / "model")
    assert not (merged / "adapter").exists()  # the merged model alone: the adapter is the other download
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(merged).eval()(**prompt).logits,
                                   loaded(**prompt).logits, rtol=1e-4, atol=1e-5)


def test_smollm2s_adapter_names_its_base_by_its_hub_id(alice_team, alice_dataset, base_dir, tmp_path):
    checkpoint = Checkpoint.objects.create(name="SmolLM2-135M-Instruct", path="tiny-llama",
                                           source=Checkpoint.Source.SMOLLM2, status=Checkpoint.Status.READY)
    trial, _ = lora_export(on_checkpoint(make_experiment(alice_team, alice_dataset).trials.first(), checkpoint),
                           base_dir)
    checkpoint.delete()  # taken out of the catalog since: the experiment's record of it names the base
    config = json.loads((packed(trial, "adapter", tmp_path / "first") / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "SmolLM2-135M-Instruct"
    trial.archives.all().delete()
    checkpoint.pk = None
    checkpoint.save()
    on_checkpoint(trial, checkpoint)
    config = json.loads((packed(trial, "adapter", tmp_path / "again") / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_packing_counts_its_bytes_as_it_goes(alice_team, alice_dataset, base_dir, monkeypatch):
    trial, _ = lora_export(make_experiment(alice_team, alice_dataset).trials.first(), base_dir)
    (Path(trial.export_path) / "extra.bin").write_bytes(bytes(8 << 20))  # several reads' worth
    archive = archives.trial_archive_request(trial=trial, kind="model")
    assert (archive.total_bytes, archive.packed_bytes, archive.percent) == (
        archives.trial_downloads(trial=trial)[1].content_bytes, 0, 0)
    monkeypatch.setattr(archives, "PROGRESS_EVERY_S", 0.0)
    seen = []
    add = archives._Progress.add

    def watched(progress: archives._Progress, n: int) -> None:
        add(progress, n)
        seen.append(TrialArchive.objects.get(pk=archive.pk).packed_bytes)  # what the page and the API read

    monkeypatch.setattr(archives._Progress, "add", watched)
    archives.trial_archive_build(archive_id=archive.pk)
    archive.refresh_from_db()
    assert archive.status == TrialArchive.Status.READY and archive.percent == 100
    assert 0 < min(seen) < archive.total_bytes // 2 and seen == sorted(seen)
    assert archive.packed_bytes == archive.total_bytes


def test_a_trial_without_lora_has_no_adapter_to_download(alice_client, alice_team, alice_dataset,
                                                         alice_api):  # noqa: F811
    trial = finished(make_experiment(alice_team, alice_dataset).trials.first())
    Path(trial.export_path).mkdir(parents=True)
    (Path(trial.export_path) / "config.json").write_text("{}")
    assert [d.kind for d in archives.trial_downloads(trial=trial)] == ["model"]
    with pytest.raises(ValidationError, match="has no adapter to download"):
        archives.trial_archive_request(trial=trial, kind="adapter")
    assert alice_api.post(f"/trials/{trial.pk}/archive?kind=adapter").status_code == 400
    assert alice_api.post(f"/trials/{trial.pk}/archive?kind=weights").status_code == 400
    assert alice_client.post(reverse("trial_archive", args=[trial.pk]), {"kind": "weights"}).status_code == 404
    assert [d["kind"] for d in alice_api.get(f"/trials/{trial.pk}/downloads").json()] == ["model"]


def test_the_page_shows_each_download_with_its_size_then_the_progress(alice_client, alice_team, alice_dataset,
                                                                       base_dir, alice_api):  # noqa: F811
    trial, _ = lora_export(make_experiment(alice_team, alice_dataset).trials.first(), base_dir)
    offered = {d.kind: d for d in archives.trial_downloads(trial=trial)}
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    for kind, title in (("adapter", "adapter"), ("model", "merged model")):
        assert f'id="download-{kind}"' in page and f"Prepare {title} (.tar.gz)" in page
    assert "data-poll" not in page
    listed = {d["kind"]: d for d in alice_api.get(f"/trials/{trial.pk}/downloads").json()}
    assert (listed["adapter"]["content_bytes"], listed["adapter"]["status"]) == (offered["adapter"].content_bytes,
                                                                                 "none")
    alice_client.post(reverse("trial_archive", args=[trial.pk]), {"kind": "adapter"})
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert "Packing: 0%" in page and 'data-poll="' in page and "Prepare merged model (.tar.gz)" in page
    archives.trial_archive_build(archive_id=TrialArchive.objects.get(kind="adapter").pk)
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert "Download adapter (.tar.gz)" in page and "data-poll" not in page
    response = alice_client.get(reverse("trial_export", args=[trial.pk]) + "?kind=adapter")
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)), mode="r:gz") as tar:
        assert f"sweep-trial-1-id-{trial.pk}-adapter/adapter_model.safetensors" in tar.getnames()
    assert alice_api.get(f"/trials/{trial.pk}/archive?kind=adapter").json()["download"] == (
        f"/api/v1/trials/{trial.pk}/export?kind=adapter")
