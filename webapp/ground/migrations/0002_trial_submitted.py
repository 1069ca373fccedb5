from django.db import migrations, models


def mark_reported_trials_submitted(apps, schema_editor) -> None:
    # A trial past planning has had its state reported by the scheduler, which therefore holds it. Trials still
    # planning stay unmarked: the reconciler submits them again, which is one submission if the first landed.
    Trial = apps.get_model("experiments", "Trial")
    Trial.objects.exclude(status__in=["new", "planning"]).update(submitted=True)


class Migration(migrations.Migration):

    dependencies = [
        ('experiments', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='trial',
            name='submitted',
            field=models.BooleanField(default=False, help_text='Whether the scheduler holds this attempt; a launched one not yet submitted waits in this outbox.'),
        ),
        migrations.RunPython(mark_reported_trials_submitted, migrations.RunPython.noop),
    ]
