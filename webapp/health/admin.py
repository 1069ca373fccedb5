from django.contrib import admin, messages

from webapp import queue_client
from webapp.health.models import HostCapacity, SkippedEntry


@admin.register(HostCapacity)
class HostCapacityAdmin(admin.ModelAdmin):
    list_display = ["host_id", "capacity_gib"]

    def save_model(self, request, obj, form, change) -> None:  # type: ignore[no-untyped-def]
        if change and "host_id" in form.changed_data:  # the old host goes back to its own capacity
            _send(request, form.initial["host_id"], None)
        super().save_model(request, obj, form, change)
        _send(request, obj.host_id, HostCapacity.bytes_for(obj.host_id))

    def delete_model(self, request, obj) -> None:  # type: ignore[no-untyped-def]
        super().delete_model(request, obj)
        _send(request, obj.host_id, None)


def _send(request, host_id: str, capacity_bytes: int | None) -> None:  # type: ignore[no-untyped-def]
    """Tell the host's scheduler now; if it cannot be reached, the next reconcile pass does."""
    try:
        queue_client.host_capacity_send(host_id=host_id, capacity_bytes=capacity_bytes)
    except queue_client.SchedulerUnavailable as error:
        messages.warning(request, f"Saved; the scheduler will take the capacity when it can be reached ({error}).")


@admin.register(SkippedEntry)
class SkippedEntryAdmin(admin.ModelAdmin):
    list_display = ["created", "host", "stream", "entry_id", "trial", "error"]
    list_filter = ["stream", "host"]
    search_fields = ["trial", "entry_id"]
