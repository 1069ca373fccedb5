"""The trial page's form to continue a finished or pruned trial for more steps (`webapp.experiments.continuing`)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from webapp.experiments.continuing import DECAYS


class ContinueForm(forms.Form):
    prefix = "continue"  # its fields' ids stay apart from the prompt box's on the same page

    steps = forms.IntegerField(min_value=1, help_text="Optimizer steps to add.")
    lr = forms.FloatField(label="Learning rate", help_text="Peak learning rate of the added steps.")
    warmup_steps = forms.IntegerField(min_value=0, initial=0, label="Warm-up steps",
                                      help_text="Linear warm-up from 0 at the start of the added steps.")
    decay = forms.ChoiceField(choices=[(d, d) for d in DECAYS], initial="cosine",
                              help_text="Decay to 0 over the added steps after the warm-up.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limit = settings.HYDRA.caps.steps_per_trial
        self.fields["steps"].max_value = limit
        self.fields["steps"].validators.append(forms.IntegerField(max_value=limit).validators[-1])
        self.fields["steps"].widget.attrs["max"] = limit

    def clean_lr(self) -> float:
        lr = self.cleaned_data["lr"]
        if not 0 < lr <= 1:
            raise forms.ValidationError("The learning rate must be above 0 and at most 1.")
        return lr

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        steps, warmup = data.get("steps"), data.get("warmup_steps")
        if steps is not None and warmup is not None and warmup > steps:
            self.add_error("warmup_steps", f"The warm-up cannot be longer than the {steps} added steps.")
        return data

    def values(self) -> dict[str, Any]:
        """The arguments of `continuing.trial_continue`."""
        return {key: self.cleaned_data[key] for key in ("steps", "lr", "warmup_steps", "decay")}
