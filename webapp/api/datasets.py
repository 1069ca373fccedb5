"""Datasets: upload one (or take a built-in sample), list them, look at one and at its first text or examples."""

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import File, Form, Router, Status
from ninja.errors import HttpError
from ninja.files import UploadedFile
from ninja.pagination import paginate

from webapp.api.auth import audit, team_of
from webapp.api.pagination import BoundedLimitOffset
from webapp.api.schemas import DatasetOut
from webapp.datasets import selectors, services
from webapp.datasets.forms import DatasetForm, upload_limit_error
from webapp.datasets.models import Dataset
from webapp.datasets.uploads import upload_refused

router = Router(tags=["datasets"])


@router.get("", response=list[DatasetOut], summary="The team's datasets, newest first")
@paginate(BoundedLimitOffset)
def dataset_list(request: HttpRequest, status: str | None = None, name: str | None = None) -> QuerySet[Dataset]:
    """``status``: only the datasets of this status (one of tokenizing, ready, failed); ``name``: only those of
    this name, in any case."""
    datasets = selectors.dataset_list(team=team_of(request)).order_by("-created", "-pk")
    if status and status not in Dataset.Status.values:
        raise ValidationError({"status": f"Give one of {', '.join(Dataset.Status.values)}."})
    if name:
        datasets = datasets.filter(name__iexact=name)
    return datasets.filter(status=status) if status else datasets


@router.post("", response={201: DatasetOut}, summary="Upload a corpus or instruction data, or take a sample")
def dataset_create(
    request: HttpRequest,
    source: str = Form("upload", description="upload, sample, sample_chat, sample_pairs or import"),
    name: str = Form("", description="Defaults to the file's name."),
    kind: str = Form("", description="Instruction data only: what its rows hold (text, prompt_completion, alpaca, "
                                     "messages, preference); empty: detect from the columns."),
    columns: str = Form("", description="Instruction data only: the column of each role, as a JSON object "
                                        '({"prompt": "question", "completion": "answer"}) or role=column pairs '
                                        "separated by commas; empty: the roles' common names."),
    vocab_size: str = Form("2048"),
    val_fraction: str = Form("0.1"),
    server_path: str = Form("", description="source=import: a file under the server's import folder."),
    file: UploadedFile | None = File(None),
) -> Status:
    """The same checks and messages as the datasets page. The tokenizer is trained in the background: poll
    the dataset until its ``status`` is ready (or failed, with ``message``)."""
    team = team_of(request)
    if upload_refused(request):
        raise HttpError(413, upload_limit_error(settings.HYDRA.max_upload_bytes))
    form = DatasetForm({"source": source, "name": name, "kind": kind, "columns": columns, "vocab_size": vocab_size,
                        "val_fraction": val_fraction, "server_path": server_path}, request.FILES)
    if not form.is_valid():
        raise ValidationError({field: list(messages) for field, messages in form.errors.items()})
    data = form.cleaned_data
    dataset = services.dataset_create(
        team=team, user=request.user, name=data["name"], corpus=data["corpus"], source=data["source"],
        vocab_size=data["vocab_size"], val_fraction=data["val_fraction"], filename=data["filename"],
        kind=data["kind"], columns=data["columns"])
    audit(request, "dataset.create", f"dataset {dataset.pk}")
    return Status(201, dataset)


@router.get("/{id:dataset_id}", response=DatasetOut, summary="One dataset")
def dataset_detail(request: HttpRequest, dataset_id: int) -> Dataset:
    return selectors.dataset_get(team=team_of(request), dataset_id=dataset_id)


@router.get("/{id:dataset_id}/preview",
            summary="A ready dataset's first text and its tokens, or first examples or pairs")
def dataset_preview(request: HttpRequest, dataset_id: int) -> dict[str, Any]:
    dataset = selectors.dataset_get(team=team_of(request), dataset_id=dataset_id)
    if not dataset.is_ready:
        raise HttpError(409, f"Dataset {dataset.name} is {dataset.get_status_display().lower()}; its preview "
                             "comes once it is ready.")
    if dataset.is_preference:
        return {"kind": dataset.kind, **selectors.dataset_pairs_preview(dataset=dataset)}
    if dataset.is_instruction:
        return {"kind": dataset.kind, **selectors.dataset_examples_preview(dataset=dataset)}
    return {"kind": dataset.kind, **selectors.dataset_preview(dataset=dataset)}
