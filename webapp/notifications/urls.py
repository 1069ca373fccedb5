from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.notifications import views

urlpatterns = [
    path("teams/<id:team_id>/notifications/", views.notification_settings, name="notification_settings"),
    path("teams/<id:team_id>/notifications/secret/", views.notification_secret_rotate,
         name="notification_secret_rotate"),
]
