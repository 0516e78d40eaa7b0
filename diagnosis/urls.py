from __future__ import annotations

from django.urls import path

from diagnosis import views

app_name = "diagnosis"

urlpatterns = [
    path("sessions/", views.session_list, name="session-list"),
    path("sessions/new/", views.session_create, name="session-create"),
    path("sessions/new/suggest/", views.session_suggest, name="session-suggest"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session-detail"),
    path("sessions/<uuid:session_id>/answer/", views.session_answer, name="session-answer"),
    path("sessions/<uuid:session_id>/cancel/", views.session_cancel, name="session-cancel"),
    path("sessions/<uuid:session_id>/close/", views.session_close, name="session-close"),
    path("sessions/<uuid:session_id>/retry/", views.session_retry, name="session-retry"),
    path("sessions/<uuid:session_id>/switch/", views.session_switch, name="session-switch"),
    path("sessions/<uuid:session_id>/update/", views.session_update, name="session-update"),
    path("sessions/<uuid:session_id>/correct/", views.session_correct, name="session-correct"),
    path("sessions/<uuid:session_id>/delete/", views.session_delete, name="session-delete"),
    path("sessions/<uuid:session_id>/events/", views.session_events, name="session-events"),
    path("sessions/<uuid:session_id>/report.md", views.session_report, name="session-report"),
]
