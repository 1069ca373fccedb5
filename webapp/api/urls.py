from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.api import views
from webapp.api.api import api

urlpatterns = [
    path("api/v1/", api.urls),
    path("account/tokens/", views.tokens, name="api_tokens"),
    path("account/tokens/<id:token_id>/revoke/", views.token_revoke_view, name="api_token_revoke"),
    path("teams/<id:team_id>/audit/", views.team_audit, name="team_audit"),
]
