from django.urls import path

from webapp.leaderboards import views

urlpatterns = [
    path("leaderboards/", views.leaderboard_index, name="leaderboard_index"),
    path("leaderboards/<int:dataset_id>/", views.leaderboard, name="leaderboard"),
]
