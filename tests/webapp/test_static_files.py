"""Static files in development come from the finders: Plotly's bundle from the project's static files, a missing
file is a 404."""

from __future__ import annotations

from django.contrib.staticfiles import finders
from django.test import Client


def test_it_finds_the_plotly_bundle():
    assert finders.find("vendor/plotly.min.js").endswith("plotly.min.js")


def test_a_missing_file_is_found_nowhere():
    assert finders.find("vendor/missing.js") is None
    assert finders.find("vendor/missing.js", find_all=True) == []


def test_a_missing_static_file_answers_404(settings):
    assert settings.WHITENOISE_USE_FINDERS  # development serves straight from the finders
    for path in ("/static/vendor/missing.js", "/static/missing.css"):
        assert Client().get(path).status_code == 404, path
