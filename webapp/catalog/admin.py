from django.contrib import admin

from webapp.catalog.models import Checkpoint


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["name", "path", "status", "family", "n_params", "context_length", "vocab_size", "created"]
    list_filter = ["status", "family", "source"]
    readonly_fields = ["tokenizer_sha256", "send_attempts", "resend_at", "send_error"]
