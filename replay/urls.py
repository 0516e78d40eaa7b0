from __future__ import annotations

from django.urls import path

from replay import views

app_name = "replay"

urlpatterns = [
    path("history/", views.history_search, name="history"),
    path("replay/<uuid:session_id>/", views.replay_step, name="replay-step"),
    path("replay/<uuid:session_id>/events/<int:seq>/", views.replay_event, name="replay-event"),
    path("replay/<uuid:session_id>/chain/", views.replay_chain, name="replay-chain"),
    path("replay/<uuid:session_id>/export/", views.replay_export, name="replay-export"),
    path("replay/exports/<slug:job_id>/", views.export_status, name="export-status"),
    path("replay/exports/<slug:job_id>/download/", views.export_download, name="export-download"),
]
