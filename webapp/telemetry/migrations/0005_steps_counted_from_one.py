"""Stored steps and evaluations count the steps done, from 1, as every page and the API do: rows stored at the
workers' 0-based numbering move up by one. The unique constraints are set aside while they move, since rows
of one trial would meet their neighbours' steps half-way through the UPDATE."""

from django.db import migrations, models
from django.db.models import F


def count_from_one(apps, schema_editor):
    for name in ("StepMetric", "EvalMetric"):
        apps.get_model("telemetry", name).objects.update(step=F("step") + 1)


def count_from_zero(apps, schema_editor):
    for name in ("StepMetric", "EvalMetric"):
        apps.get_model("telemetry", name).objects.update(step=F("step") - 1)


class Migration(migrations.Migration):

    dependencies = [
        ('telemetry', '0004_eval_bpb'),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='stepmetric', name='unique_step_metric'),
        migrations.RemoveConstraint(model_name='evalmetric', name='unique_eval_metric'),
        migrations.RunPython(count_from_one, count_from_zero),
        migrations.AddConstraint(
            model_name='stepmetric',
            constraint=models.UniqueConstraint(fields=('trial', 'attempt', 'step'), name='unique_step_metric'),
        ),
        migrations.AddConstraint(
            model_name='evalmetric',
            constraint=models.UniqueConstraint(fields=('trial', 'attempt', 'step'), name='unique_eval_metric'),
        ),
        migrations.AlterField(
            model_name='stepmetric',
            name='step',
            field=models.PositiveIntegerField(help_text='The step it made, counted from 1.'),
        ),
        migrations.AlterField(
            model_name='evalmetric',
            name='step',
            field=models.PositiveIntegerField(help_text='The steps done when it was measured.'),
        ),
    ]
