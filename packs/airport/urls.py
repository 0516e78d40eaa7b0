from __future__ import annotations

from django.urls import path

from packs.airport import views

app_name = "airport"

urlpatterns = [
    path("airport/", views.board, name="board"),
    path(
        "airport/restrictions/<int:restriction_id>/lift/",
        views.restriction_lift,
        name="restriction-lift",
    ),
]
