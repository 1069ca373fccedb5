from django.contrib import admin

from webapp.notifications.models import Delivery, Notice, NotificationSettings


@admin.register(NotificationSettings)
class NotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ["team", "updated", "updated_by"]
    exclude = ["secret"]  # signs the team's webhooks: an owner rotates it on the team's page
    readonly_fields = ["secret_created", "updated_by"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["created", "team", "channel", "target", "status", "attempts", "delivered_at"]
    list_filter = ["status", "channel"]
    readonly_fields = ["uid", "notice", "send_attempts", "resend_at", "send_error"]


@admin.register(Notice)
class NoticeAdmin(admin.ModelAdmin):
    list_display = ["created", "team", "event", "key"]
    list_filter = ["event"]
