"""The prompt box of a finished trial's page: a prompt and sampling settings, each checked against its bounds."""

from __future__ import annotations

from django import forms

from webapp.experiments.generations import Settings
from webapp.ground.models import Generation

DEFAULTS = {"max_new_tokens": 64, "temperature": 0.8, "top_p": 0.95, "seed": 0}


class GenerationForm(forms.Form):
    prompt = forms.CharField(
        max_length=Generation.PROMPT_MAX_CHARS, strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "The text the model continues"}),
        help_text=f"At most {Generation.PROMPT_MAX_CHARS} characters.")
    max_new_tokens = forms.IntegerField(min_value=1, max_value=Generation.MAX_NEW_TOKENS, label="New tokens",
                                        help_text=f"1 to {Generation.MAX_NEW_TOKENS}.")
    temperature = forms.FloatField(min_value=0.0, max_value=Generation.MAX_TEMPERATURE,
                                   widget=forms.NumberInput(attrs={"step": "any"}),
                                   help_text="0 takes the most likely token every time.")
    top_p = forms.FloatField(min_value=0.01, max_value=1.0, label="Top-p",
                             widget=forms.NumberInput(attrs={"step": "any"}), help_text="0.01 to 1.")
    seed = forms.IntegerField(min_value=0, max_value=Generation.MAX_SEED, help_text="Same seed, same text.")

    def clean_prompt(self) -> str:
        prompt: str = self.cleaned_data["prompt"]
        if not prompt.strip():
            raise forms.ValidationError("Write some text for the model to continue.")
        return prompt

    def settings(self) -> Settings:
        """The cleaned settings; call after ``is_valid()``."""
        return Settings(**self.cleaned_data)


def generation_initial(last: Generation | None) -> dict[str, object]:
    """The form's values: those of the trial's last generation (to try a variation), else the defaults."""
    if last is None:
        return dict(DEFAULTS)
    return {"prompt": last.prompt, "max_new_tokens": last.max_new_tokens, "temperature": last.temperature,
            "top_p": last.top_p, "seed": last.seed}
