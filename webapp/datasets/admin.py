from django.contrib import admin

from webapp.datasets.models import Dataset


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "source", "vocab_size", "n_tokens", "created"]
    list_filter = ["team", "source"]
    readonly_fields = ["fingerprint", "storage_key"]
