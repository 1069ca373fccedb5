from django.urls import path, re_path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.experiments import organize_views, views

urlpatterns = [
    path("", views.experiment_list, name="home"),
    path("experiments/", views.experiment_list, name="experiment_list"),
    path("experiments/new/", views.experiment_create, name="experiment_create"),
    path("experiments/previews/<id:preview_id>/", views.experiment_preview, name="experiment_preview"),
    re_path(r"^experiments/chat-templates/(?P<digest>[0-9a-f]{64})/$", views.chat_template_check,
            name="chat_template_check"),
    path("experiments/<id:experiment_id>/", views.experiment_detail, name="experiment_detail"),
    path("experiments/<id:experiment_id>/delete/", views.experiment_delete, name="experiment_delete"),
    path("experiments/<id:experiment_id>/search-space.<str:fmt>", views.experiment_space, name="experiment_space"),
    path("experiments/<id:experiment_id>/notes/", organize_views.experiment_annotations,
         name="experiment_annotations"),
    path("experiments/<id:experiment_id>/<slug:action>/", views.experiment_action, name="experiment_action"),
    path("trials/<id:trial_id>/", views.trial_detail, name="trial_detail"),
    path("trials/<id:trial_id>/delete/", views.trial_delete, name="trial_delete"),
    path("trials/<id:trial_id>/export.tar.gz", views.trial_export, name="trial_export"),
    path("trials/<id:trial_id>/archive/", views.trial_archive, name="trial_archive"),
    path("trials/<id:trial_id>/generate/", views.trial_generate, name="trial_generate"),
    path("trials/<id:trial_id>/continue/", views.trial_continue, name="trial_continue"),
    path("trials/<id:trial_id>/generations/<id:generation_id>/", views.trial_generation, name="trial_generation"),
    path("trials/<id:trial_id>/notes/", organize_views.trial_annotations, name="trial_annotations"),
    path("trials/<id:trial_id>/<slug:action>/", views.trial_action, name="trial_action"),
    path("comparisons/", organize_views.comparison_list, name="comparison_list"),
    path("comparisons/new/", organize_views.comparison_create, name="comparison_create"),
    path("comparisons/<id:comparison_id>/", organize_views.comparison_open, name="comparison_open"),
    path("comparisons/<id:comparison_id>/delete/", organize_views.comparison_delete, name="comparison_delete"),
]
