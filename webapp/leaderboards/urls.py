from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.leaderboards import views

urlpatterns = [
    path("leaderboards/", views.leaderboard_index, name="leaderboard_index"),
    path("leaderboards/<id:dataset_id>/", views.leaderboard, name="leaderboard"),
]
