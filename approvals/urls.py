from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.approval_queue, name="queue"),
    path("<int:approval_id>/decide/", views.approval_decide, name="decide"),
    path("<int:approval_id>/edit/", views.approval_edit_args, name="edit-args"),
    path("<int:approval_id>/edit-form/", views.approval_edit_form, name="edit-form"),
    path(
        "incidents/<uuid:session_id>/map/",
        views.approval_incident_map,
        name="incident-map",
    ),
    path(
        "incidents/<uuid:session_id>/decide-r1/",
        views.approval_bulk_decide,
        name="bulk-decide",
    ),
    path("notify/", views.approval_notify, name="notify"),
    path("todos/", views.todo_list, name="todo-list"),
    path("todos/<int:todo_id>/resolve/", views.todo_resolve, name="todo-resolve"),
]
