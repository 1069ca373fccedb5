import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('experiments', '0005_web_work_sends'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Generation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('send_attempts', models.PositiveSmallIntegerField(default=0, help_text='Times its task was sent to the web worker (or tried) since the work was asked for.')),
                ('resend_at', models.DateTimeField(blank=True, help_text="When the ingest's pass sends its task again if the work is still pending.", null=True)),
                ('send_error', models.TextField(blank=True, help_text='Why the last send failed; empty once one reached Redis.')),
                ('queue_id', models.CharField(help_text='The attempt whose exported model generates.', max_length=40)),
                ('prompt', models.TextField(help_text='The text to continue, at most 4000 characters.')),
                ('max_new_tokens', models.PositiveSmallIntegerField(help_text='Tokens to generate, at most.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(256)])),
                ('temperature', models.FloatField(help_text='Sampling temperature; 0 takes the most likely token every time (greedy).', validators=[django.core.validators.MinValueValidator(0.0), django.core.validators.MaxValueValidator(2.0)])),
                ('top_p', models.FloatField(help_text='Nucleus sampling: draw from the smallest set of tokens this likely together.', validators=[django.core.validators.MinValueValidator(0.01), django.core.validators.MaxValueValidator(1.0)])),
                ('seed', models.PositiveIntegerField(help_text="The sampling's random seed: equal settings give equal text.", validators=[django.core.validators.MaxValueValidator(2147483647)])),
                ('status', models.CharField(choices=[('pending', 'Generating…'), ('done', 'Done'), ('failed', 'Failed')], default='pending', max_length=10)),
                ('text', models.TextField(blank=True, help_text='The generated continuation (without the prompt).')),
                ('message', models.TextField(blank=True, help_text='Why generating failed, for the UI.')),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('finished', models.DateTimeField(blank=True, null=True)),
                ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('trial', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='generations', to='experiments.trial')),
            ],
            options={
                'ordering': ['-created', '-pk'],
            },
        ),
    ]
