from django.contrib import admin

from webapp.ground.models import Experiment, Trial


class TrialInline(admin.TabularInline):
    model = Trial
    extra = 0
    fields = ["number", "status", "step", "total_steps", "best_val_loss", "queue_id"]
    readonly_fields = fields


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "dataset", "strategy", "created", "launched"]
    list_filter = ["team", "strategy"]
    inlines = [TrialInline]


@admin.register(Trial)
class TrialAdmin(admin.ModelAdmin):
    list_display = ["__str__", "status", "step", "total_steps", "best_val_ppl", "finished"]
    list_filter = ["status"]
