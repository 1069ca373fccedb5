from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("webapp.health.urls")),
    path("", include("webapp.accounts.urls")),
    path("", include("webapp.datasets.urls")),
    path("", include("webapp.experiments.urls")),
    path("", include("webapp.leaderboards.urls")),
    path("", include("webapp.catalog.urls")),
    path("", include("webapp.labqueue.urls")),
    path("", include("webapp.notifications.urls")),
    path("dashboards/", include("webapp.dashboards.urls")),
    path("", include("webapp.api.urls")),
]
