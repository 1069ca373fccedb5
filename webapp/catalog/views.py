"""Catalog pages: the list with sizes and fits and the forms that add to it, a checkpoint's page (refreshing
while the web worker imports it), and removal. Every page needs a signed-in user; none needs a team. Adding and
removing take a catalog manager or staff: the list shows its forms to them only, and the views that change the
catalog answer anyone else with the 403 page, before reading the form."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.catalog import selectors, services, sizing
from webapp.catalog.forms import GgufForm, RegisterForm
from webapp.catalog.models import Checkpoint
from webapp.datasets.http import form_add_errors


def _list_page(request: HttpRequest, *, register: RegisterForm | None = None, gguf: GgufForm | None = None,
               smollm2_error: str = "", status: int = 200) -> HttpResponse:
    checkpoints = list(selectors.checkpoint_list())
    devices = sizing.host_devices()
    rows = [(c, sizing.fits(c, devices) if c.is_ready else []) for c in checkpoints]
    return render(request, "catalog/checkpoint_list.html", {
        "rows": rows, "devices": devices, "models_root": settings.HYDRA.models_root,
        "can_add": selectors.catalog_can_add(user=request.user),
        "register_form": register or RegisterForm(), "gguf_form": gguf or GgufForm(), "smollm2_error": smollm2_error,
        "smollm2_name": services.SMOLLM2_NAME,
    }, status=status)


@login_required
def catalog_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request)


def _added(request: HttpRequest, checkpoint: Checkpoint, what: str) -> HttpResponse:
    reached = "" if checkpoint.send_error else "; the web worker is on it"
    messages.success(request, f"{checkpoint.name}: {what}{reached}.")
    return redirect("checkpoint_detail", checkpoint_id=checkpoint.pk)


@login_required
@require_POST
def catalog_register(request: HttpRequest) -> HttpResponse:
    services.catalog_check_can_add(actor=request.user)
    form = RegisterForm(request.POST)
    if form.is_valid():
        try:
            checkpoint = services.checkpoint_register(actor=request.user, name=form.cleaned_data["name"],
                                                      path=form.cleaned_data["path"])
        except ValidationError as error:
            form_add_errors(form, _on_field(error, "path"))
        else:
            return _added(request, checkpoint, "registered, to be checked")
    return _list_page(request, register=form, status=400)


@login_required
@require_POST
def catalog_import_gguf(request: HttpRequest) -> HttpResponse:
    services.catalog_check_can_add(actor=request.user)
    form = GgufForm(request.POST)
    if form.is_valid():
        try:
            checkpoint = services.checkpoint_import_gguf(actor=request.user, name=form.cleaned_data["name"],
                                                         gguf_file=form.cleaned_data["gguf_file"])
        except ValidationError as error:
            form_add_errors(form, _on_field(error, "gguf_file"))
        else:
            return _added(request, checkpoint, "to be imported")
    return _list_page(request, gguf=form, status=400)


@login_required
@require_POST
def catalog_add_smollm2(request: HttpRequest) -> HttpResponse:
    try:
        checkpoint = services.checkpoint_add_smollm2(actor=request.user)
    except ValidationError as error:
        return _list_page(request, smollm2_error=" ".join(error.messages), status=400)
    return _added(request, checkpoint, "to be installed and imported")


@login_required
def checkpoint_detail(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = selectors.checkpoint_get(checkpoint_id=checkpoint_id)
    fits = sizing.fits(checkpoint, sizing.host_devices()) if checkpoint.is_ready else []
    bases = sizing.base_sizes(checkpoint) if checkpoint.is_ready else []
    return render(request, "catalog/checkpoint_detail.html", {
        "checkpoint": checkpoint, "fits": fits, "bases": bases, "models_root": settings.HYDRA.models_root,
        "can_remove": selectors.checkpoint_can_remove(user=request.user, checkpoint=checkpoint),
    })


@login_required
@require_http_methods(["GET", "POST"])
def checkpoint_remove(request: HttpRequest, checkpoint_id: int) -> HttpResponse:
    checkpoint = selectors.checkpoint_get(checkpoint_id=checkpoint_id)
    if request.method == "POST":
        try:
            services.checkpoint_remove(actor=request.user, checkpoint=checkpoint)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return redirect("checkpoint_detail", checkpoint_id=checkpoint.pk)
        messages.success(request, f"{checkpoint.name} is removed from the catalog.")
        return redirect("catalog_list")
    if checkpoint.status == Checkpoint.Status.IMPORTING:
        messages.error(request, f"{checkpoint.name} is being imported; remove it once it is ready or failed.")
        return redirect("checkpoint_detail", checkpoint_id=checkpoint.pk)
    services.checkpoint_check_can_remove(actor=request.user, checkpoint=checkpoint)
    return render(request, "catalog/checkpoint_confirm_remove.html", {"checkpoint": checkpoint})


def _on_field(error: ValidationError, field: str) -> ValidationError:
    """A service's path error without a field goes to the form's path field, where the user typed it."""
    return error if hasattr(error, "error_dict") else ValidationError({field: error.messages})
