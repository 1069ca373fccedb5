"""Dataset pages: list and create (upload or sample), detail, delete."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from webapp.datasets import selectors, services
from webapp.datasets.forms import DatasetForm, upload_limit_error
from webapp.datasets.http import form_add_errors, team_required
from webapp.datasets.uploads import upload_refused


@team_required
@require_http_methods(["GET", "POST"])
def dataset_list(request: HttpRequest) -> HttpResponse:
    limit = settings.HYDRA.max_upload_bytes
    if upload_refused(request):
        # The body was cut off at the file: what came after it (the other fields) never arrived.
        form = DatasetForm(initial=request.POST.dict())
        return render(request, "datasets/dataset_list.html", {
            "datasets": selectors.dataset_list(team=request.team), "form": form, "max_upload_bytes": limit,
            "upload_error": upload_limit_error(limit),
        }, status=413)
    form = DatasetForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            dataset = services.dataset_create(
                team=request.team, user=request.user, name=data["name"], corpus=data["corpus"],
                source=data["source"], vocab_size=data["vocab_size"], val_fraction=data["val_fraction"],
                filename=data["filename"], kind=data["kind"], columns=data["columns"],
            )
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            # Its page says why the web worker has not started yet, when the send did not reach Redis.
            training = "" if dataset.send_error else "; its tokenizer is being trained"
            messages.success(request, f"Dataset {dataset.name} is stored{training}.")
            return redirect("dataset_detail", dataset_id=dataset.pk)
    status = 400 if form.errors else 200
    return render(
        request, "datasets/dataset_list.html",
        {"datasets": selectors.dataset_list(team=request.team), "form": form, "max_upload_bytes": limit},
        status=status,
    )


@team_required
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = selectors.dataset_get(team=request.team, dataset_id=dataset_id)
    corpus = dataset.is_ready and not dataset.is_instruction
    examples = dataset.is_ready and dataset.is_instruction and not dataset.is_preference
    pairs = dataset.is_ready and dataset.is_preference
    return render(
        request, "datasets/dataset_detail.html",
        {
            "dataset": dataset, "preview": selectors.dataset_preview(dataset=dataset) if corpus else None,
            "examples": selectors.dataset_examples_preview(dataset=dataset) if examples else None,
            "pairs": selectors.dataset_pairs_preview(dataset=dataset) if pairs else None,
            "can_delete": selectors.dataset_can_delete(user=request.user, dataset=dataset),
            "token_sets": dataset.token_sets.order_by("model_name"),
        },
    )


@team_required
@require_http_methods(["GET", "POST"])
def dataset_delete(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = selectors.dataset_get(team=request.team, dataset_id=dataset_id)
    services.dataset_require_delete(actor=request.user, dataset=dataset)
    if request.method == "POST":
        try:
            services.dataset_delete(dataset=dataset, actor=request.user)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return redirect("dataset_detail", dataset_id=dataset.pk)
        messages.success(request, f"Dataset {dataset.name} deleted.")
        return redirect("dataset_list")
    return render(request, "datasets/dataset_confirm_delete.html", {"dataset": dataset})
