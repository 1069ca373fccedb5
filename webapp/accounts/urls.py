from django.contrib.auth import views as auth_views
from django.urls import path

from webapp import ids  # noqa: F401 -- registers the <id:...> converter
from webapp.accounts import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("teams/", views.team_list, name="team_list"),
    path("teams/switch/", views.team_switch, name="team_switch"),
    path("teams/<id:team_id>/", views.team_detail, name="team_detail"),
    path("teams/<id:team_id>/members/add/", views.member_add, name="member_add"),
    path("teams/<id:team_id>/members/remove/", views.member_remove, name="member_remove"),
    path("teams/<id:team_id>/members/role/", views.member_role, name="member_role"),
    path("teams/<id:team_id>/invitations/<id:invitation_id>/withdraw/", views.invitation_withdraw,
         name="invitation_withdraw"),
    path("invitations/<id:invitation_id>/accept/", views.invitation_accept, name="invitation_accept"),
    path("invitations/<id:invitation_id>/decline/", views.invitation_decline, name="invitation_decline"),
]
