from __future__ import annotations

from django.urls import path

from api import token_views

app_name = "api-tokens"

urlpatterns = [
    path("", token_views.token_list, name="list"),
    path("new/", token_views.token_create, name="create"),
    path("<int:token_id>/revoke/", token_views.token_revoke, name="revoke"),
]
